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
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace trident {

inline constexpr char kMegatronIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
inline constexpr uint64_t kMegatronIndexVersion = 1;
inline constexpr uint8_t kMegatronDtypeUint16 = 8;

// Writes prefix.bin and prefix.idx for tokens[0, count), cut into documents of
// doc_lengths tokens (they must sum to count; each fits int32).
Status write_megatron_dataset(const std::string& prefix, const uint16_t* tokens /*[count]*/,
                              uint64_t count, const std::vector<uint64_t>& doc_lengths);

}  // namespace trident
