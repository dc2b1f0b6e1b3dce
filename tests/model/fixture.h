// Reader for the TRFX fixtures written by tests/reference/make_fixtures.py (the format
// is documented there): named float64 / int32 / text arrays with int64 dims.
// Test code: a malformed or missing file throws std::runtime_error naming the file,
// which gtest reports as a test failure.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace trident::reference {

struct FixtureEntry {
  enum Kind : uint8_t { kF64 = 0, kI32 = 1, kText = 2 };
  Kind kind = kF64;
  std::vector<int64_t> dims;
  std::vector<double> f64;   // kF64
  std::vector<int32_t> i32;  // kI32
  std::string text;          // kText

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  std::vector<float> to_f32() const { return std::vector<float>(f64.begin(), f64.end()); }
};

class Fixture {
 public:
  static Fixture load(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error(path + ": cannot open fixture");
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Fixture fx;
    fx.path_ = path;
    size_t pos = 0;
    auto take = [&](void* dst, size_t n) {
      if (pos + n > bytes.size()) throw std::runtime_error(path + ": truncated fixture");
      std::memcpy(dst, bytes.data() + pos, n);
      pos += n;
    };
    char magic[4];
    take(magic, 4);
    if (std::memcmp(magic, "TRFX", 4) != 0) throw std::runtime_error(path + ": bad magic");
    uint32_t version = 0, count = 0;
    take(&version, 4);
    take(&count, 4);
    if (version != 1) throw std::runtime_error(path + ": unsupported fixture version");
    for (uint32_t e = 0; e < count; ++e) {
      uint32_t name_len = 0;
      take(&name_len, 4);
      std::string name(name_len, '\0');
      take(name.data(), name_len);
      uint8_t kind = 0, ndim = 0;
      take(&kind, 1);
      take(&ndim, 1);
      FixtureEntry entry;
      entry.kind = static_cast<FixtureEntry::Kind>(kind);
      entry.dims.resize(ndim);
      take(entry.dims.data(), ndim * sizeof(int64_t));
      const size_t n = static_cast<size_t>(entry.numel());
      switch (entry.kind) {
        case FixtureEntry::kF64:
          entry.f64.resize(n);
          take(entry.f64.data(), n * sizeof(double));
          break;
        case FixtureEntry::kI32:
          entry.i32.resize(n);
          take(entry.i32.data(), n * sizeof(int32_t));
          break;
        case FixtureEntry::kText:
          entry.text.resize(n);
          take(entry.text.data(), n);
          break;
        default:
          throw std::runtime_error(path + ": entry " + name + " has an unknown dtype");
      }
      fx.entries_.emplace(std::move(name), std::move(entry));
    }
    return fx;
  }

  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  const FixtureEntry& at(const std::string& name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) throw std::runtime_error(path_ + ": no entry " + name);
    return it->second;
  }
  const std::vector<double>& f64(const std::string& name) const { return at(name).f64; }
  const std::vector<int32_t>& i32(const std::string& name) const { return at(name).i32; }
  const std::string& text(const std::string& name) const { return at(name).text; }
  double scalar(const std::string& name) const { return at(name).f64.at(0); }
  int32_t int_scalar(const std::string& name) const { return at(name).i32.at(0); }
  // Names of the entries that start with `prefix`, with the prefix removed, sorted.
  std::vector<std::string> names_with_prefix(const std::string& prefix) const {
    std::vector<std::string> out;
    for (const auto& [name, entry] : entries_) {
      if (name.compare(0, prefix.size(), prefix) == 0) out.push_back(name.substr(prefix.size()));
    }
    return out;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::map<std::string, FixtureEntry> entries_;
};

}  // namespace trident::reference
