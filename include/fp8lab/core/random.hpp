// Counter-based random bits for stochastic rounding: the bits for element i depend only on
// (seed, i), never on thread count, chunking or SIMD width (docs/spec.md §2).
#pragma once

#include <cstdint>

namespace fp8lab {

// SplitMix64's finalizer: a bijective 64-bit mixer.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Chris Wellons' "lowbias32" integer hash: a bijection of 32-bit words with low bias.
constexpr std::uint32_t hash32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Keys for the 2^32-element block of indices that `index` lies in. Kernels compute this once
// per block and then hash the low 32 bits of the index per lane.
struct StreamKey {
  std::uint32_t k0, k1;
};
constexpr StreamKey stream_key(std::uint64_t seed, std::uint64_t index) {
  const std::uint64_t k = mix64(seed ^ mix64(index >> 32));
  return {static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(k >> 32)};
}
constexpr std::uint32_t random_bits(StreamKey key, std::uint32_t index_lo) {
  return hash32(hash32(index_lo ^ key.k0) ^ key.k1);
}
// The 32 random bits of element `index` of the stream `seed`.
constexpr std::uint32_t random_bits(std::uint64_t seed, std::uint64_t index) {
  return random_bits(stream_key(seed, index), static_cast<std::uint32_t>(index));
}

}  // namespace fp8lab
