// The plan's table and JSON (plan/plan.h).
#include <algorithm>
#include <cstdio>

#include "plan/plan.h"

namespace trident {
namespace {

constexpr double kGiB = 1073741824.0;

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, x);
  return buf;
}
std::string gib(double bytes) { return fmt("%.1f GiB", bytes / kGiB); }

}  // namespace

nlohmann::json layout_json(const PlanResult& r) {
  const PlanCandidate& l = r.candidate;
  nlohmann::json comm = nlohmann::json::object();
  for (const ParallelDim d : kPlannedDims) comm[dim_name(d)] = r.comm[d];
  comm["expert_dp"] = r.expert_dp_comm;
  return {{"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"cp", l.cp},
          {"ep", l.ep},
          {"virtual_stages", l.virtual_stages},
          {"zero_stage", l.zero_stage},
          {"sequence_parallel", l.sequence_parallel},
          {"recompute", recompute_name(l.recompute)},
          {"micro_batch_size", l.micro_batch_size},
          {"fits", r.fits},
          {"memory_bytes",
           {{"params", r.memory.params},
            {"grads", r.memory.grads},
            {"optimizer", r.memory.optimizer},
            {"activations", r.memory.activations},
            {"buffers", r.memory.buffers + r.memory.workspace},
            {"workspace", r.memory.workspace},
            {"fragmentation", r.memory.fragmentation},
            {"total", r.memory.total}}},
          {"comm_bytes_per_step", comm},
          {"bubble", r.bubble},
          {"step_time_s", r.step_time_s},
          // Where the step goes: the parts add up to step_time_s (dp: exposed).
          {"time_s",
           {{"compute", r.compute_s},
            {"recompute", r.recompute_s},
            {"bubble", r.bubble_s},
            {"tp", r.tp_s},
            {"pp", r.pp_s},
            {"cp", r.cp_s},
            {"ep", r.ep_s},
            {"dp", r.dp_s},
            {"dp_slowdown", r.dp_slowdown_s},
            {"optimizer", r.optimizer_s}}},
          // Of time_s.tp and time_s.dp: the waits for the group's other ranks to arrive.
          {"arrival_skew_s", {{"tp", r.tp_skew_s}, {"dp", r.dp_skew_s}}},
          {"dp_comm_s", r.dp_comm_s},
          {"stage_pp_wait_s", r.stage_pp_wait_s},
          {"overlap_grad_reduce", r.overlap_grad_reduce},
          {"overlap_param_gather", r.overlap_param_gather},
          {"cp_ring_overlapped", r.cp_ring_overlapped},
          {"tokens_per_s_per_gpu", r.tokens_per_s_per_gpu},
          {"mfu", r.mfu},
          {"reason", r.reason}};
}

nlohmann::json plan_json(const Plan& plan) {
  nlohmann::json layouts = nlohmann::json::array();
  for (const PlanResult& l : plan.layouts) layouts.push_back(layout_json(l));
  return {{"devices", plan.devices},
          {"gpu", plan.gpu},
          {"gpus_per_node", plan.gpus_per_node},
          {"model",
           {{"parameters", plan.parameters},
            {"active_parameters", plan.active_parameters},
            {"flops_per_token", plan.flops_per_token}}},
          {"configured", plan.configured_error.empty() ? layout_json(plan.configured) : nlohmann::json()},
          {"dp_auto", plan.dp_auto},
          {"recommended", plan.recommended >= 0 ? layout_json(plan.layouts[0]) : nlohmann::json()},
          {"layouts", std::move(layouts)}};
}

std::string plan_table(const Plan& plan, int rows) {
  // GiB columns, or MiB when every layout is under 1 GiB (small CPU models).
  double largest = plan.configured_error.empty() ? plan.configured.memory.total : 0.0;
  for (const PlanResult& l : plan.layouts) largest = std::max(largest, l.memory.total);
  const bool mib = largest < kGiB;
  const double unit = mib ? 1048576.0 : kGiB;
  std::string out;
  char line[768];
  std::snprintf(line, sizeof(line),
                "# %-5s %-38s %5s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %6s %8s %8s %8s %8s %8s "
                "%8s %8s %8s %8s %8s %8s %9s %6s  %s\n",
                "rank", "layout", "fits", mib ? "mem MiB" : "mem GiB", "params", "grads", "optim",
                "activ", "buffers", "host", "dp GB", "tp GB", "pp GB", "ep GB", "bubble", "step s", "comp s",
                "recomp s", "bubl s", "tp s", "pp s", "cp s", "ep s", "dp s", "slow s", "opt s",
                "tok/s/gpu", "MFU",
                "reason");
  out += line;
  auto row = [&](const std::string& rank, const PlanResult& r) {
    const PlanMemory& m = r.memory;
    std::snprintf(line, sizeof(line),
                  "  %-5s %-38s %5s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.2f %8.2f %8.2f %8.2f "
                  "%5.1f%% %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %9.0f "
                  "%5.1f%%  %s\n",
                  rank.c_str(), layout_name(r.candidate).c_str(), r.fits ? "yes" : "NO",
                  m.total / unit, m.params / unit, m.grads / unit, m.optimizer / unit,
                  m.activations / unit, (m.buffers + m.workspace) / unit, m.host / unit,
                  r.comm[ParallelDim::kDp] / 1e9, r.comm[ParallelDim::kTp] / 1e9,
                  r.comm[ParallelDim::kPp] / 1e9, r.comm[ParallelDim::kEp] / 1e9, 100 * r.bubble, r.step_time_s, r.compute_s,
                  r.recompute_s, r.bubble_s, r.tp_s, r.pp_s, r.cp_s, r.ep_s, r.dp_s, r.dp_slowdown_s, r.optimizer_s,
                  r.tokens_per_s_per_gpu, 100 * r.mfu, r.reason.c_str());
    out += line;
  };
  const int shown = std::min<int>(rows, static_cast<int>(plan.layouts.size()));
  for (int i = 0; i < shown; ++i) row(std::to_string(i + 1), plan.layouts[static_cast<size_t>(i)]);
  if (shown < static_cast<int>(plan.layouts.size())) {
    out += "  ... " + std::to_string(plan.layouts.size() - shown) + " more layouts (--json lists all)\n";
  }
  if (plan.configured_error.empty()) {
    row("conf", plan.configured);
  } else {
    out += "# configured: " + plan.configured_error + "\n";
  }
  if (!plan.configured_note.empty()) out += "# configured: " + plan.configured_note + "\n";
  int fitting = 0;
  for (const PlanResult& l : plan.layouts) fitting += l.fits;
  out += std::string("# dp s: the dp communication no compute covers, with "
                     "parallel.overlap_grad_reduce=") +
         (plan.overlap_grad_reduce ? "true" : "false") + " and parallel.overlap_param_gather=" +
         (plan.overlap_param_gather ? "true" : "false") + "\n";
  bool slowed = plan.configured_error.empty() && plan.configured.dp_slowdown_s > 0;
  for (const PlanResult& l : plan.layouts) slowed |= l.dp_slowdown_s > 0;
  if (slowed) {
    out += "# slow s: the compute that dp collectives in flight slow (CPU ranks whose threads "
           "outnumber the cores); dp s is the compute threads' waits\n";
  }
  bool skewed = plan.configured_error.empty() && plan.configured.tp_skew_s + plan.configured.dp_skew_s > 0;
  for (const PlanResult& l : plan.layouts) skewed |= l.tp_skew_s + l.dp_skew_s > 0;
  if (skewed) {
    out += "# tp s, dp s: include the ranks' waits for each other's arrival at the group's "
           "collectives (the hardware table's cpu.arrival_skew)\n";
  }
  if (plan.selective_reruns == SelectiveReruns::kTorchtitanOp) {
    out += "# recomp s: selective reruns as torchtitan's op-level policy "
           "(--selective-reruns torchtitan-op: every other matmul and the elementwise ops; "
           "memory planned as Trident's selective)\n";
  }
  bool any_cp = plan.configured_error.empty() && plan.configured.candidate.cp > 1;
  for (const PlanResult& l : plan.layouts) any_cp = any_cp || l.candidate.cp > 1;
  if (any_cp) {
    out += std::string("# cp s: the cp ring's k/v and dK/dV exchanges, ") +
           (plan.cp_ring_overlapped
                ? "the part the block attention they overlap does not hide (and the last "
                  "dK/dV hop)"
                : "all exposed (TRIDENT_RING_OVERLAP=0: not overlapped with the block "
                  "attention)") +
           "\n";
  }
  bool any_ep = plan.configured_error.empty() && plan.configured.candidate.ep > 1;
  for (const PlanResult& l : plan.layouts) any_ep = any_ep || l.candidate.ep > 1;
  if (any_ep) {
    out += "# ep GB, ep s: the all-to-all of tokens to their experts and back (balanced "
           "routing), all exposed; dp s includes the experts' reduction over dp / ep ranks\n";
  }
  out += fmt("# model: %.2fB parameters", plan.parameters / 1e9) +
         fmt(", %.2fB active per token", plan.active_parameters / 1e9) +
         fmt(", %.3g FLOPs per token (MFU counts these)\n", plan.flops_per_token);
  if (plan.configured_only) {
    out += "# --configured-only: the configured layout alone on " + std::to_string(plan.devices) +
           " x " + plan.gpu + " (" + std::to_string(plan.gpus_per_node) +
           " per node); no search, no recommendation\n";
    return out;
  }
  out += "# " + std::to_string(plan.layouts.size()) + " valid layouts on " +
         std::to_string(plan.devices) + " x " + plan.gpu + " (" +
         std::to_string(plan.gpus_per_node) + " per node), " + std::to_string(fitting) + " fit\n";
  if (plan.recommended >= 0) {
    const PlanResult& r = plan.layouts[0];
    out += "recommended: " + layout_name(r.candidate) + fmt(": %.3f s/step", r.step_time_s) +
           fmt(", %.0f tokens/s per device", r.tokens_per_s_per_gpu) +
           fmt(", MFU %.1f%%", 100 * r.mfu) + ", " + gib(r.memory.total) + " per rank of " +
           gib(r.capacity) + "\n";
  } else {
    out += "recommended: none (no layout fits)\n";
  }
  return out;
}

}  // namespace trident
