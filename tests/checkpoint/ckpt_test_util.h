// Helpers for the checkpoint tests: a temporary directory (tests/common/scratch_dir.h), a
// small set of global tensors with known contents (1-D, 2-D, 3-D, 0-D), ways to cut them
// into boxes, and byte-level file surgery (flip, truncate).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/box.h"
#include "checkpoint/train_state.h"
#include "checkpoint/writer.h"
#include "comm/communicator.h"
#include "tests/common/scratch_dir.h"

namespace trident::test {

using TempDir = testing::ScratchDir;

// A global tensor with reproducible contents: element i is id * 1000 + i * 0.5 + salt.
struct GlobalTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // (shape...) row-major
};

inline std::vector<GlobalTensor> make_tensors(float salt = 0.0f) {
  std::vector<GlobalTensor> ts = {{"param/w", {6, 10}, {}},
                                  {"param/b", {7}, {}},
                                  {"adam_m/conv", {3, 4, 5}, {}},
                                  {"state/scale", {}, {}}};
  for (size_t id = 0; id < ts.size(); ++id) {
    const int64_t n = volume(ts[id].shape);
    for (int64_t i = 0; i < n; ++i) {
      ts[id].data.push_back(static_cast<float>(id) * 1000.0f + static_cast<float>(i) * 0.5f + salt);
    }
  }
  return ts;
}

// Boxes with their own copy of the data (a rank's shards).
struct OwnedBox {
  std::string tensor;
  std::vector<int64_t> shape, start, extent;
  std::vector<float> data;
};

inline OwnedBox cut(const GlobalTensor& t, std::vector<int64_t> start, std::vector<int64_t> extent) {
  OwnedBox b{t.name, t.shape, start, extent, std::vector<float>(volume(extent))};
  if (!b.data.empty()) {
    std::vector<int64_t> zeros(t.shape.size(), 0);
    copy_region(t.data.data(), zeros, t.shape, b.data.data(), start, extent, start, extent,
                sizeof(float));
  }
  return b;
}

inline std::vector<BoxRef> refs(const std::vector<OwnedBox>& boxes) {
  std::vector<BoxRef> out;
  for (const OwnedBox& b : boxes) out.push_back({b.tensor, b.shape, b.start, b.extent, b.data.data()});
  return out;
}

// A valid trainer state for `step`, as the trainer saves it (one rank, run `run_id`).
inline nlohmann::json train_state(int64_t step, const std::string& run_id = "run0",
                                  const std::string& uid = "",
                                  std::vector<std::string> ancestors = {}) {
  TrainState s;
  s.step = step;
  s.consumed_samples = static_cast<uint64_t>(step) * 8;
  s.optimizer_steps = step;
  s.config_yaml = "model:\n  arch: gpt2\n";
  s.run_id = run_id;
  s.checkpoint_uid = uid.empty() ? run_id + "-" + std::to_string(step) : uid;
  s.ancestors = std::move(ancestors);
  return train_state_to_json(s);
}

// Four different ways to cut the tensors of make_tensors() into boxes.
inline std::vector<OwnedBox> split(const std::vector<GlobalTensor>& ts, int way) {
  std::vector<OwnedBox> out;
  for (const GlobalTensor& t : ts) {
    const auto& s = t.shape;
    if (s.empty()) {  // scalar: one box
      out.push_back(cut(t, {}, {}));
      continue;
    }
    if (s.size() == 1) {
      if (way == 0) out.push_back(cut(t, {0}, {s[0]}));
      if (way == 1) { out.push_back(cut(t, {0}, {3})); out.push_back(cut(t, {3}, {4})); }
      if (way == 2) { for (int64_t i = 0; i < s[0]; ++i) out.push_back(cut(t, {i}, {1})); }
      if (way == 3) { out.push_back(cut(t, {0}, {5})); out.push_back(cut(t, {5}, {0}));
                      out.push_back(cut(t, {5}, {2})); }
      continue;
    }
    if (s.size() == 2) {  // [6, 10]
      if (way == 0) out.push_back(cut(t, {0, 0}, s));
      if (way == 1) {  // uneven rows (FSDP dim-0 shards)
        out.push_back(cut(t, {0, 0}, {2, 10}));
        out.push_back(cut(t, {2, 0}, {1, 10}));
        out.push_back(cut(t, {3, 0}, {3, 10}));
      }
      if (way == 2) {  // a 2 x 2 grid (TP columns x FSDP rows)
        out.push_back(cut(t, {0, 0}, {3, 4}));
        out.push_back(cut(t, {0, 4}, {3, 6}));
        out.push_back(cut(t, {3, 0}, {3, 4}));
        out.push_back(cut(t, {3, 4}, {3, 6}));
      }
      if (way == 3) {  // irregular: an L and the rest
        out.push_back(cut(t, {0, 0}, {4, 7}));
        out.push_back(cut(t, {0, 7}, {4, 3}));
        out.push_back(cut(t, {4, 0}, {2, 10}));
      }
      continue;
    }
    // [3, 4, 5]
    if (way == 0) out.push_back(cut(t, {0, 0, 0}, s));
    if (way == 1) { for (int64_t i = 0; i < 3; ++i) out.push_back(cut(t, {i, 0, 0}, {1, 4, 5})); }
    if (way == 2) { out.push_back(cut(t, {0, 0, 0}, {3, 4, 2})); out.push_back(cut(t, {0, 0, 2}, {3, 4, 3})); }
    if (way == 3) {
      out.push_back(cut(t, {0, 0, 0}, {2, 1, 5}));
      out.push_back(cut(t, {0, 1, 0}, {2, 3, 5}));
      out.push_back(cut(t, {2, 0, 0}, {1, 4, 4}));
      out.push_back(cut(t, {2, 0, 4}, {1, 4, 1}));
    }
  }
  return out;
}

inline CheckpointWriterOptions writer_options(const std::string& dir) {
  CheckpointWriterOptions o;
  o.dir = dir;
  return o;
}

inline void flip_byte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(offset);
  f.write(&c, 1);
}

inline void truncate_by(const std::string& path, int64_t bytes) {
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - static_cast<uint64_t>(bytes));
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

}  // namespace trident::test
