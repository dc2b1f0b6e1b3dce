// The safetensors file format (Hugging Face): the weights file of an exported model
// (model/hf_export.h) and of a model.init_from directory.
//
// Layout: u64 little-endian N; N bytes of JSON
//   {"<name>": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"format": "pt"}}
// (padded with spaces to a multiple of 8 so the data is aligned); then the data section,
// each tensor row-major little-endian at [begin, end) relative to the section's start.
//
// encode_safetensors writes F32 only (the bytes; the caller writes them durably).
// read_safetensors reads F32, BF16 and F16 (widened to fp32) and validates everything it
// reads: every failure is Status::invalid_input whose message starts with the path and
// says what is wrong (truncated file, header not JSON, bad entry, offsets outside the
// data section, a size that does not match the shape). Nothing aborts on bad input.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace trident {

// One F32 tensor to write: `data` holds numel(shape) floats, row-major.
struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// The whole file's bytes, tensors in the given order (names must be unique).
std::string encode_safetensors(const std::vector<SafetensorsEntry>& entries);

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // "F32", "BF16" or "F16"
  std::vector<int64_t> shape;
  std::vector<float> data;      // numel(shape) floats, widened to fp32
};

struct SafetensorsFile {
  std::string path;
  std::vector<SafetensorsTensor> tensors;  // in file order
  const SafetensorsTensor* find(std::string_view name) const;  // nullptr when absent
};

Result<SafetensorsFile> read_safetensors(const std::string& path);

}  // namespace trident
