// Reference, not built by CMake: cudnn-frontend's causal SDPA forward / backward graph
// (llm.c's options: attn_scale by value, stats, deterministic backward; io bf16, fp32
// intermediates) built on the host without a GPU, to regenerate the golden traces of
// tests/kernels/cuda/cudnn_graph_trace_test.cpp:
//   g++ -std=c++17 -I<cudnn-frontend@3929da2>/include -I/usr/local/cuda/include \
//       fe_sdpa_graph.cpp -o fe_sdpa_graph -L/usr/local/cuda/lib64 -lcudnn -lcudart -ldl
//   CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=fe.log ./fe_sdpa_graph b 2 7 4 2 64
//   ./normalize.py fe.log > ../data/fe_sdpa_bwd_B2_T7_NH4_NKV2_HD64.trace
// (about two minutes to compile: cudnn-frontend is header-only and large).
#include <cudnn_frontend.h>
#include <cstdio>
namespace fe = cudnn_frontend;
int main(int argc, char** argv) {
  bool bwd = argc > 1 && argv[1][0] == 'b';
  if (argc < 7) { printf("usage: probe f|b B T NH NKV HD\n"); return 2; }
  int64_t B = atoi(argv[2]), T = atoi(argv[3]), H = atoi(argv[4]), HK = atoi(argv[5]), D = atoi(argv[6]);
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(fe::DataType_t::FLOAT);
  graph->set_sm_version(90);
  auto Q = graph->tensor(fe::graph::Tensor_attributes().set_name("Q").set_dim({B, H, T, D}).set_uid(1).set_stride({T*H*D, D, H*D, 1}));
  auto K = graph->tensor(fe::graph::Tensor_attributes().set_name("K").set_dim({B, HK, T, D}).set_uid(2).set_stride({T*HK*D, D, HK*D, 1}));
  auto V = graph->tensor(fe::graph::Tensor_attributes().set_name("V").set_dim({B, HK, T, D}).set_uid(3).set_stride({T*HK*D, D, HK*D, 1}));
  auto scale = graph->tensor(fe::graph::Tensor_attributes().set_name("attn_scale").set_dim({1,1,1,1}).set_stride({1,1,1,1}).set_uid(10).set_is_pass_by_value(true).set_data_type(fe::DataType_t::FLOAT));
  if (!bwd) {
    auto opts = fe::graph::SDPA_attributes().set_name("fa").set_generate_stats(true).set_attn_scale(scale).set_causal_mask(true);
    auto [O, stats] = graph->sdpa(Q, K, V, opts);
    O->set_output(true).set_dim({B, H, T, D}).set_stride({H*D*T, D, H*D, 1}).set_uid(4);
    stats->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_dim({B,H,T,1}).set_stride({H*T,T,1,1}).set_uid(5);
  } else {
    auto O = graph->tensor(fe::graph::Tensor_attributes().set_name("O").set_dim({B, H, T, D}).set_uid(4).set_stride({T*H*D, D, H*D, 1}));
    auto dO = graph->tensor(fe::graph::Tensor_attributes().set_name("dO").set_dim({B, H, T, D}).set_uid(6).set_stride({T*H*D, D, H*D, 1}));
    auto stats = graph->tensor(fe::graph::Tensor_attributes().set_name("stats").set_dim({B,H,T,1}).set_uid(5).set_stride({H*T,T,1,1}).set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes().set_name("fab").set_deterministic_algorithm(true).set_causal_mask(true).set_attn_scale(scale);
    auto [dQ, dK, dV] = graph->sdpa_backward(Q, K, V, O, dO, stats, opts);
    dQ->set_output(true).set_dim({B,H,T,D}).set_stride({T*H*D, D, H*D, 1}).set_uid(7);
    dK->set_output(true).set_dim({B,HK,T,D}).set_stride({T*HK*D, D, HK*D, 1}).set_uid(8);
    dV->set_output(true).set_dim({B,HK,T,D}).set_stride({T*HK*D, D, HK*D, 1}).set_uid(9);
  }
  auto e = graph->validate();
  printf("validate: %s %s\n", e.is_good() ? "ok" : "FAIL", e.err_msg.c_str());
  e = graph->build_operation_graph(nullptr);
  printf("build_operation_graph: %s %s\n", e.is_good() ? "ok" : "FAIL", e.err_msg.c_str());
  return 0;
}
