#include "core/status.h"

namespace trident {

int Status::exit_code() const {
  switch (code_) {
    case StatusCode::kOk:
      return 0;
    case StatusCode::kInvalidConfig:
    case StatusCode::kInvalidInput:
      return 2;
    default:
      return 1;
  }
}

}  // namespace trident
