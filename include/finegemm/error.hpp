// finegemm::Error — every invalid argument ends here, with a message that names the
// argument, what was expected and what was given.
#pragma once
#include <stdexcept>
#include <string>

namespace finegemm {

// Python maps Value → ValueError subclass, Type → TypeError subclass.
enum class ErrorKind { Value, Type, Runtime };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  explicit Error(const std::string& message) : Error(ErrorKind::Value, message) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace finegemm
