// FakeCommunicator: the base of the tests' stand-in communicators. It answers rank(),
// size() and backend() from its constructor and does nothing for every collective, so a
// fake overrides only the calls whose behaviour its test is about (block, record, copy).
// do_split returns null: a fake group has no subgroups.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "comm/communicator.h"

namespace trident::testing {

class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(std::string name, int rank, int size, const char* backend)
      : Communicator(std::move(name)), rank_(rank), size_(size), backend_(backend) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return backend_; }

 protected:
  void do_all_reduce(const CommBuf&, ReduceOp, const CollectiveOptions&) override {}
  void do_reduce_scatter(const CommBuf&, const CommBuf&, const CollectiveOptions&) override {}
  void do_all_gather(const CommBuf&, const CommBuf&, const CollectiveOptions&) override {}
  void do_broadcast(const CommBuf&, int, const CollectiveOptions&) override {}
  void do_send(const CommBuf&, int, int, const CollectiveOptions&) override {}
  void do_recv(const CommBuf&, int, int, const CollectiveOptions&) override {}
  void do_barrier(const CollectiveOptions&) override {}
  void do_all_to_all(const CommBuf&, std::span<const std::size_t>, const CommBuf&,
                     std::span<const std::size_t>, const CollectiveOptions&) override {}
  std::unique_ptr<Communicator> do_split(int, int, std::string, MemSpace,
                                         const CollectiveOptions&) override {
    return nullptr;
  }

 private:
  int rank_;
  int size_;
  const char* backend_;
};

}  // namespace trident::testing
