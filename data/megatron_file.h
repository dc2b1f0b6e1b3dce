// Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py), written by
// `trident prepare --format megatron`: <prefix>.bin holds the tokens back to back, and
// <prefix>.idx, little-endian:
//   9 bytes   magic "MMIDIDX\0\0"
//   uint64    version 1
//   uint8     dtype code (Megatron's DType: uint8 1, int8 2, int16 3, int32 4, int64 5,
//             float64 6, float32 7, uint16 8); Trident writes uint16 = 8
//   uint64    sequence count S
//   uint64    document count D + 1 (the entries of document_indices)
//   int32[S]  sequence lengths, in tokens
//   int64[S]  sequence pointers, byte offsets into .bin
//   int64[D+1] document indices: 0, then the index of the sequence after each document
// Trident writes one sequence per document (what preprocess_data.py does without
// --split-sentences), so the document indices are 0, 1, ..., D.
//
// Both files are written durably and atomically (temp file, fsync, rename, fsync of the
// directory); errors name the file.
//
// Reading (open_megatron_dataset): Trident trains on the concatenation of the sequences
// in order, which is the whole .bin when the pointers are contiguous — as Megatron's
// writer (and its merge of datasets) always makes them. The reader checks, naming the
// .idx or .bin and the field: the magic, version 1, the dtype code (uint16 = 8 and
// int32 = 4, what Megatron's preprocess_data.py writes; others are refused naming the
// code), that the file holds the arrays its counts announce (no more, except the int8
// sequence modes of a multimodal index), lengths >= 0, every pointer within the .bin,
// contiguous pointers from 0 (a gap or overlap is refused: those bytes would be read as
// tokens), that the sequences cover the .bin exactly, and that the document indices are
// non-decreasing within [0, S]. The .bin is then mmapped as a headerless TokenFile;
// int32 tokens are read as uint32 (a negative id is a huge one and fails the vocabulary
// check). The index is read once and not kept: memory does not grow with S.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/token_file.h"

namespace trident {

inline constexpr char kMegatronIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
inline constexpr uint64_t kMegatronIndexVersion = 1;
inline constexpr uint8_t kMegatronDtypeUint16 = 8;
inline constexpr uint8_t kMegatronDtypeInt32 = 4;
// magic + version + dtype + sequence count + document count
inline constexpr uint64_t kMegatronIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;

// Megatron's DType name of a code ("float32" for 7), or "unknown".
const char* megatron_dtype_name(uint8_t code);

// What an index says, once validated against its .bin.
struct MegatronIndex {
  uint8_t dtype_code = 0;
  int token_width = 0;      // 2 (uint16) or 4 (int32)
  uint64_t sequences = 0;   // S
  uint64_t doc_indices = 0; // entries of document_indices (documents + 1)
  uint64_t tokens = 0;      // sum of the sequence lengths
};

// Reads and validates idx_path against a .bin of bin_bytes bytes (see above);
// invalid_input naming idx_path (or bin_path for a size mismatch) and the field.
Result<MegatronIndex> read_megatron_index(const std::string& idx_path, const std::string& bin_path,
                                          uint64_t bin_bytes);
// <prefix>.idx validated, then <prefix>.bin mapped as a TokenFile whose path is the .bin.
Result<TokenFile> open_megatron_dataset(const std::string& prefix);

// Writes prefix.bin and prefix.idx for tokens[0, count), cut into documents of
// doc_lengths tokens (they must sum to count; each fits int32).
Status write_megatron_dataset(const std::string& prefix, const uint16_t* tokens /*[count]*/,
                              uint64_t count, const std::vector<uint64_t>& doc_lengths);
// The same with int32 tokens (dtype code 4), as Megatron writes for vocabularies of
// 65500 and more.
Status write_megatron_dataset(const std::string& prefix, const int32_t* tokens /*[count]*/,
                              uint64_t count, const std::vector<uint64_t>& doc_lengths);

}  // namespace trident
