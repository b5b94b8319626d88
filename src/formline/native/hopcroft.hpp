// Hopcroft's partition refinement: the coarsest partition of a DFA's states that refines the
// initial labels and in which the states of one block move, on every column, into one block.
//
// Why not Moore's rounds (refine_partition's bounded mode in kernel.hpp): they are as many as
// the automaton is deep, and a string field with maxLength 255 is 255 rounds over every state;
// minimisation was 15% of 60 MaskBench compiles after the NFA build went native. Hopcroft
// costs O(columns x states x log states) whatever the depth.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace formline {

// `targets`: states x columns (-1: no transition; it goes to an implicit sink, a block of its
// own). `partition`: the initial block of each state, 0..count-1. Writes the final block of
// each state to `partition` (numbered arbitrarily) and returns the number of blocks, sink
// excluded.
inline int32_t hopcroft_refine(const std::vector<int32_t>& targets, int32_t states,
                               int32_t columns, std::vector<int32_t>& partition) {
  const int32_t n = states + 1;  // the sink is state `states`
  // Inverse transitions per target state, (column, source); the sink's are
  // never read (it is never a splitter), so they are not stored: a splitter then costs its
  // in-edges, not its size times the columns (a 700-state object member has 46 byte classes).
  std::vector<int32_t> inverse_begin(static_cast<size_t>(n) + 1, 0);
  for (int32_t state = 0; state < states; ++state)
    for (int32_t column = 0; column < columns; ++column) {
      const int32_t target = targets[static_cast<size_t>(state) * columns + column];
      if (target >= 0) ++inverse_begin[target + 1];
    }
  for (int32_t k = 0; k < n; ++k) inverse_begin[k + 1] += inverse_begin[k];
  std::vector<std::pair<int32_t, int32_t>> inverse(inverse_begin.back());
  {
    std::vector<int32_t> cursor(inverse_begin.begin(), inverse_begin.end() - 1);
    for (int32_t state = 0; state < states; ++state)
      for (int32_t column = 0; column < columns; ++column) {
        const int32_t target = targets[static_cast<size_t>(state) * columns + column];
        if (target >= 0) inverse[cursor[target]++] = {column, state};
      }
  }
  // The refinable partition: each block is a run [first, end) of `elements`, its marked
  // members moved to the front [first, middle).
  int32_t initial_blocks = 0;
  for (int32_t state = 0; state < states; ++state)
    initial_blocks = std::max(initial_blocks, partition[state] + 1);
  std::vector<int32_t> block(n), location(n), elements(n);
  std::vector<int32_t> first, end, middle;
  {
    std::vector<int32_t> sizes(initial_blocks + 1, 0);
    for (int32_t state = 0; state < states; ++state) block[state] = partition[state];
    block[states] = initial_blocks;
    for (int32_t state = 0; state < n; ++state) ++sizes[block[state]];
    int32_t offset = 0;
    for (int32_t b = 0; b <= initial_blocks; ++b) {
      first.push_back(offset);
      middle.push_back(offset);
      offset += sizes[b];
      end.push_back(offset);
    }
    std::vector<int32_t> cursor(first);
    for (int32_t state = 0; state < n; ++state) {
      location[state] = cursor[block[state]]++;
      elements[location[state]] = state;
    }
  }
  // Splitters are whole blocks, all columns at once: when a block splits, Hopcroft's rule
  // (whether or not it waits, its smaller part must) adds the new, smaller part. Every initial
  // block but the sink's waits: stability against all blocks but one implies the last.
  std::vector<int32_t> work;
  for (int32_t b = 0; b < initial_blocks; ++b) work.push_back(b);
  // The splitter's in-edges bucketed by column (no sort: buckets are reused, and only the
  // columns used are visited and cleared).
  std::vector<std::vector<int32_t>> by_column(columns);
  std::vector<int32_t> used_columns, touched;
  while (!work.empty()) {
    const int32_t a = work.back();
    work.pop_back();
    // Collect first, mark after: marking reorders members inside their blocks, `a` included.
    for (int32_t k = first[a]; k < end[a]; ++k) {
      const int32_t target = elements[k];
      for (int32_t e = inverse_begin[target]; e < inverse_begin[target + 1]; ++e) {
        auto& bucket = by_column[inverse[e].first];
        if (bucket.empty()) used_columns.push_back(inverse[e].first);
        bucket.push_back(inverse[e].second);
      }
    }
    for (int32_t column : used_columns) {
      touched.clear();
      for (int32_t source : by_column[column]) {
        const int32_t b = block[source];
        const int32_t at = location[source];
        if (at < middle[b]) continue;  // marked already
        if (middle[b] == first[b]) touched.push_back(b);
        const int32_t swapped = elements[middle[b]];
        elements[at] = swapped;
        location[swapped] = at;
        elements[middle[b]] = source;
        location[source] = middle[b];
        ++middle[b];
      }
      by_column[column].clear();
      for (int32_t b : touched) {
        if (middle[b] == end[b]) {  // every member moves into `a`: nothing to split
          middle[b] = first[b];
          continue;
        }
        // The smaller part becomes the new block (relabelled: O(smaller part)).
        const int32_t fresh = static_cast<int32_t>(first.size());
        if (middle[b] - first[b] <= end[b] - middle[b]) {
          first.push_back(first[b]);
          end.push_back(middle[b]);
          first[b] = middle[b];
        } else {
          first.push_back(middle[b]);
          end.push_back(end[b]);
          end[b] = middle[b];
        }
        middle.push_back(first[fresh]);
        middle[b] = first[b];
        for (int32_t k = first[fresh]; k < end[fresh]; ++k) block[elements[k]] = fresh;
        work.push_back(fresh);
      }
    }
    used_columns.clear();
  }
  for (int32_t state = 0; state < states; ++state) partition[state] = block[state];
  int32_t count = 0;
  std::vector<uint8_t> used(first.size(), 0);
  for (int32_t state = 0; state < states; ++state)
    if (!used[block[state]]) {
      used[block[state]] = 1;
      ++count;
    }
  return count;
}

}  // namespace formline
