#include "model/safetensors.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "model/finite_weights.h"

namespace trident {
namespace {

// Headers larger than this are not weights files (HF's own reader caps at 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

void put_u64_le(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64_le(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

float f16_to_float(uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  }
  return sign ? -v : v;
}

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

}  // namespace

std::string encode_safetensors(const std::vector<SafetensorsEntry>& entries) {
  // An ordered_json keeps the tensors in the order given, so the header reads like the
  // data section (HF's writer sorts; readers do not care).
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    uint64_t numel = 1;
    for (int64_t d : e.shape) numel *= static_cast<uint64_t>(d);
    header[e.name] = {{"dtype", "F32"}, {"shape", e.shape},
                      {"data_offsets", {offset, offset + 4 * numel}}};
    offset += 4 * numel;
  }
  std::string json = header.dump();
  while (json.size() % 8 != 0) json.push_back(' ');
  std::string out;
  out.reserve(8 + json.size() + offset);
  put_u64_le(&out, json.size());
  out += json;
  for (const SafetensorsEntry& e : entries) {
    size_t numel = 1;
    for (int64_t d : e.shape) numel *= static_cast<size_t>(d);
    // Little-endian hosts only (x86-64, aarch64): the floats are the file's bytes.
    out.append(reinterpret_cast<const char*>(e.data), 4 * numel);
  }
  return out;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  for (const SafetensorsTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Result<SafetensorsFile> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::invalid_input(path + ": cannot open safetensors file: " +
                                 std::strerror(errno));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string bytes = buf.str();
  if (bytes.size() < 8) {
    return Status::invalid_input(path + ": truncated safetensors file: " +
                                 std::to_string(bytes.size()) +
                                 " bytes, shorter than the 8-byte header length");
  }
  const uint64_t n = get_u64_le(bytes.data());
  if (n > kMaxHeaderBytes || n > bytes.size() - 8) {
    return Status::invalid_input(path + ": truncated safetensors file or bad header length: " +
                                 "the header claims " + std::to_string(n) + " bytes, the file has " +
                                 std::to_string(bytes.size() - 8) + " after the length");
  }
  nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + n,
                                                nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Status::invalid_input(path + ": the safetensors header is not a JSON object");
  }
  const uint64_t data_begin = 8 + n;
  const uint64_t data_size = bytes.size() - data_begin;
  SafetensorsFile file;
  file.path = path;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = path + ": tensor '" + name + "': ";
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() ||
        !entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2) {
      return Status::invalid_input(where + "malformed header entry " + entry.dump());
    }
    SafetensorsTensor t;
    t.name = name;
    t.dtype = entry["dtype"].get<std::string>();
    const size_t elem = dtype_bytes(t.dtype);
    if (elem == 0) {
      return Status::invalid_input(where + "unsupported dtype " + t.dtype +
                                   " (supported: F32, BF16, F16)");
    }
    uint64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 40)) {
        return Status::invalid_input(where + "bad shape " + entry["shape"].dump());
      }
      t.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
      if (numel > (1ull << 40)) return Status::invalid_input(where + "shape too large");
    }
    const auto& offs = entry["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
      return Status::invalid_input(where + "bad data_offsets " + offs.dump());
    }
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    if (begin > end || end - begin != numel * elem) {
      return Status::invalid_input(where + "data_offsets " + offs.dump() + " hold " +
                                   std::to_string(end - begin) + " bytes but shape " +
                                   entry["shape"].dump() + " of " + t.dtype + " needs " +
                                   std::to_string(numel * elem));
    }
    if (end > data_size) {
      return Status::invalid_input(where + "truncated safetensors file: data ends at byte " +
                                   std::to_string(end) + " of a " + std::to_string(data_size) +
                                   "-byte data section");
    }
    const char* src = bytes.data() + data_begin + begin;
    t.data.resize(numel);
    if (t.dtype == "F32") {
      std::memcpy(t.data.data(), src, 4 * numel);
    } else {
      for (uint64_t i = 0; i < numel; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        t.data[i] = t.dtype == "BF16" ? bf16_to_float(bf16_t{h}) : f16_to_float(h);
      }
    }
    const std::string bad = non_finite_problem(t.data.data(), t.data.size());
    if (!bad.empty()) {
      return Status::invalid_input(where + bad);
    }
    file.tensors.push_back(std::move(t));
  }
  return file;
}

}  // namespace trident
