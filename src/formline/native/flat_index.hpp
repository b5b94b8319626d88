// The two maps of flatten_rules (_kernel.pyx): a node object's address -> its number, and a
// node's value as bytes (its kind, then its fields, children by number) -> its number.
//
// Why not std::unordered_map: it allocates a node per entry (and the value map a copy of the
// key string), and on MaskBench's largest grammars (3,800 node objects, 1,600 values) the two
// maps and malloc were about 60% of the flattening's samples (0.6 ms a schema). Here both are
// open addressing over flat arrays (the values' bytes in automaton.hpp's BasicKeyIndex, one
// pool); they grow by doubling at half full, so a lookup is a probe or two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "automaton.hpp"

namespace formline {

// Non-null addresses -> int32 numbers (absent: -1).
class AddressIndex {
 public:
  AddressIndex() : keys_(kInitialSlots, 0), values_(kInitialSlots, -1) {}

  int32_t find(const void* address) const {
    const uintptr_t key = reinterpret_cast<uintptr_t>(address);
    for (size_t slot = slot_of(key);; slot = (slot + 1) & (keys_.size() - 1)) {
      if (keys_[slot] == key) return values_[slot];
      if (keys_[slot] == 0) return -1;
    }
  }

  // Sets the number of `address` (a new key, or a new number for a known one).
  void insert(const void* address, int32_t value) {
    if (2 * (count_ + 1) > keys_.size()) grow();
    place(reinterpret_cast<uintptr_t>(address), value);
  }

 private:
  static constexpr size_t kInitialSlots = 1024;

  // Fibonacci hashing: the product's top bits, which every bit of the address reaches.
  size_t slot_of(uintptr_t key) const {
    return static_cast<size_t>((static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void place(uintptr_t key, int32_t value) {
    size_t slot = slot_of(key);
    while (keys_[slot] != 0 && keys_[slot] != key) slot = (slot + 1) & (keys_.size() - 1);
    if (keys_[slot] == 0) ++count_;
    keys_[slot] = key;
    values_[slot] = value;
  }

  void grow() {
    std::vector<uintptr_t> keys(keys_.size() * 2, 0);
    std::vector<int32_t> values(keys.size(), -1);
    keys.swap(keys_);
    values.swap(values_);
    --shift_;
    count_ = 0;
    for (size_t k = 0; k < keys.size(); ++k)
      if (keys[k] != 0) place(keys[k], values[k]);
  }

  std::vector<uintptr_t> keys_;
  std::vector<int32_t> values_;
  size_t count_ = 0;
  int shift_ = 54;  // 64 - log2(slots)
  static_assert(kInitialSlots == 1024, "shift_ starts at 64 - log2(kInitialSlots)");
};

// Byte strings -> int32 numbers (absent: -1): automaton.hpp's index of sequences over bytes,
// hashed here.
class BytesIndex {
 public:
  int32_t find(const char* data, size_t length) const {
    const int32_t value = index_.find(data, static_cast<int32_t>(length), hash_of(data, length));
    return value == BasicKeyIndex<char>::kAbsent ? -1 : value;
  }

  // Adds a string that find() does not know, with its number.
  void insert(const char* data, size_t length, int32_t value) {
    index_.insert(data, static_cast<int32_t>(length), hash_of(data, length), value);
  }

 private:
  static uint64_t hash_of(const char* data, size_t length) {  // FNV-1a, high bits folded in
    uint64_t hash = 1469598103934665603ull;
    for (size_t k = 0; k < length; ++k) {
      hash ^= static_cast<uint8_t>(data[k]);
      hash *= 1099511628211ull;
    }
    return hash ^ (hash >> 29);
  }

  BasicKeyIndex<char> index_{512};  // most grammars' distinct nodes: no growing
};

}  // namespace formline
