#include "plan/overlap.h"

#include <algorithm>
#include <cstddef>
#include <deque>

namespace trident {

double exposed_dp_seconds(const std::vector<OverlapOp>& ops, const OverlapPolicy& policy,
                          double* slowdown, WaitSegments* segments) {
  // The communication stream: collectives in issue order, each with the seconds it still
  // needs; item k (in issue order) has completed once `done` > k.
  struct Item {
    double left = 0;
    bool queued = false;  // a reduction counted against the queue's depth
  };
  std::deque<Item> stream;
  long issued = 0, done = 0;
  int queued_in_flight = 0;
  double t = 0, own = 0, slowed = 0;
  // The ops' compute since the compute thread last waited.
  double since_wait = segments != nullptr ? segments->open : 0;
  std::vector<double> at_end;  // reductions issued after the last op (reduce_at_end)
  auto pop = [&] {
    if (stream.front().queued) --queued_in_flight;
    stream.pop_front();
    ++done;
  };
  auto issue = [&](double seconds, bool queued) {
    stream.push_back({seconds, queued});
    if (queued) ++queued_in_flight;
    return issued++;
  };
  // The stream runs while the link is free for `dt` seconds of an op.
  auto run = [&](double dt) {
    while (dt > 0 && !stream.empty()) {
      Item& head = stream.front();
      if (head.left <= dt) {
        dt -= head.left;
        pop();
      } else {
        head.left -= dt;
        dt = 0;
      }
    }
  };
  // `c` seconds of an op's compute (at full speed): the stream runs meanwhile at
  // policy.comm_rate_in_compute, and the compute at policy.compute_rate_in_flight while
  // the stream is not empty. Returns the wall seconds it took (c when both rates are 1:
  // run(c)).
  const double rate = std::clamp(policy.compute_rate_in_flight, 1e-6, 1.0);
  const double comm_rate = std::clamp(policy.comm_rate_in_compute, 1e-6, 1.0);
  auto compute_wall = [&](double c) {
    if (rate >= 1 && comm_rate >= 1) {
      run(c);
      return c;
    }
    double wall = 0;
    while (c > 0 && !stream.empty()) {
      Item& head = stream.front();
      const double head_wall = head.left / comm_rate;  // to finish the head beside compute
      if (head_wall * rate <= c) {
        wall += head_wall;
        c -= head_wall * rate;
        pop();
      } else {
        head.left -= c / rate * comm_rate;
        wall += c / rate;
        c = 0;
      }
    }
    return wall + c;
  };
  // The compute thread waits (the link all the stream's) until item `id` has completed.
  auto wait_for = [&](long id) {
    if (done <= id && segments != nullptr) {
      segments->add(since_wait);
      since_wait = 0;
    }
    while (done <= id) {
      t += stream.front().left;
      pop();
    }
  };
  size_t prefetched_op = ops.size();  // the op whose gather is in flight ahead of it
  long prefetched_id = -1;
  for (size_t j = 0; j < ops.size(); ++j) {
    const OverlapOp& op = ops[j];
    if (op.gather > 0) {
      wait_for(prefetched_op == j ? prefetched_id : issue(op.gather, false));
      prefetched_op = ops.size();
      if (policy.prefetch) {  // the next gather, issued as this one is consumed
        for (size_t k = j + 1; k < ops.size(); ++k) {
          if (ops[k].gather > 0) {
            prefetched_id = issue(ops[k].gather, false);
            prefetched_op = k;
            break;
          }
        }
      }
    }
    const double lost = compute_wall(op.compute) - op.compute;
    t += op.compute + op.busy + lost;
    slowed += lost;
    own += op.compute + op.busy;
    since_wait += op.compute;
    if (op.reduce > 0) {
      const int n = std::max(1, op.pieces);
      for (int i = 0; i < n; ++i) {
        if (!policy.async_reduce && policy.reduce_at_end) {
          at_end.push_back(op.reduce / n);
          continue;
        }
        if (!policy.async_reduce) {
          wait_for(issue(op.reduce / n, false));
          continue;
        }
        if (policy.queue_depth > 0 && queued_in_flight >= policy.queue_depth) {
          // The queue completes its oldest reduction before it takes another.
          size_t oldest = 0;
          while (!stream[oldest].queued) ++oldest;
          wait_for(done + static_cast<long>(oldest));
        }
        issue(op.reduce / n, true);
      }
    }
  }
  for (const double seconds : at_end) wait_for(issue(seconds, false));
  while (!stream.empty()) wait_for(done);  // reduce_gradients: everything issued completes
  if (segments != nullptr) {
    segments->add(since_wait);
    segments->open = 0;
  }
  if (slowdown != nullptr) *slowdown = slowed;
  return std::max(0.0, t - own);
}

}  // namespace trident
