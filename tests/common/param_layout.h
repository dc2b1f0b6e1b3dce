// A synthetic parameter table for the tests of the parallel layer: tensors listed with
// their group, laid out as describe_params lays out a stage (groups in id order, every
// tensor at a 16-float aligned offset of the flat layout, a group's size rounded to 16).
#pragma once

#include <string>
#include <vector>

#include "core/param_layout.h"

namespace trident::testing {

struct TestTensor {
  std::string name;  // empty: the tensor's index in the table
  Shape shape;
  int group = 0;
  bool decay = false;
  int split_dim = -1;  // replicated over tp
  bool tied_copy = false;
};

// `num_groups` groups (0 .. num_groups - 1); a group no tensor names is empty.
inline ParamLayout make_test_layout(const std::vector<TestTensor>& tensors, int num_groups) {
  ParamLayout layout;
  layout.groups.resize(static_cast<size_t>(num_groups));
  size_t cursor = 0;
  for (int g = 0; g < num_groups; ++g) {
    ParamGroup& group = layout.groups[static_cast<size_t>(g)];
    group.id = g;
    group.offset = cursor;
    for (const TestTensor& t : tensors) {
      if (t.group != g) continue;
      ParamInfo info;
      info.name = t.name.empty() ? std::to_string(layout.params.size()) : t.name;
      info.shape = info.local_shape = t.shape;
      info.split_dim = t.split_dim;
      info.group = g;
      info.offset = cursor;
      info.decay = t.decay;
      info.tied_copy = t.tied_copy;
      group.params.push_back(static_cast<int>(layout.params.size()));
      layout.params.push_back(info);
      cursor = (cursor + static_cast<size_t>(info.numel()) + 15) / 16 * 16;
    }
    group.num_floats = cursor - group.offset;
  }
  return layout;
}

}  // namespace trident::testing
