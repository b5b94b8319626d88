// Applying a token bitmask to logits in place: every refused token's logit becomes minus
// infinity, one pass over the bitmask's words, without the GIL.
//
// Why native: the numpy/torch path unpacked the bits into a byte per token, compared them and
// ran a masked fill: four passes over a row and two temporaries. On 64 rows of SmolLM2's 49k
// tokens it took 1.1-1.5 ms (bench/results/apply.md, before this kernel), against 0.11-0.14 ms
// for llguidance's compiled kernel in that run; this kernel takes 0.47-0.82 ms there, beside
// llguidance's 0.42-0.47 in the same run. A vLLM step applies the mask of every constrained row.
//
// The logits are handled as unsigned integers of their width (2, 4 or 8 bytes), so one template
// serves float16, bfloat16, float32 and float64: the caller passes minus infinity's bit pattern.
#pragma once

#include <algorithm>
#include <cstdint>

namespace formline {

// One row: token t is allowed when bit t % 32 of mask[t / 32] is set and t < width; every
// other logit of the row (up to vocabulary) is set to negative_infinity. A word of all ones
// (the common case inside a string) costs one comparison; a word of zeros, 32 stores.
template <typename Bits>
void apply_bitmask_row(Bits* logits, int64_t vocabulary, const uint32_t* mask, int64_t words,
                       int64_t width, Bits negative_infinity) {
    const int64_t covered = std::max<int64_t>(0, std::min({width, words * 32, vocabulary}));
    const int64_t whole_words = covered / 32;
    for (int64_t word = 0; word < whole_words; ++word) {
        const uint32_t bits = mask[word];
        if (bits == 0xFFFFFFFFu) continue;
        Bits* out = logits + word * 32;
        if (bits == 0) {
            std::fill(out, out + 32, negative_infinity);
            continue;
        }
        uint32_t refused = ~bits;
        while (refused) {
            out[__builtin_ctz(refused)] = negative_infinity;
            refused &= refused - 1;
        }
    }
    for (int64_t token = whole_words * 32; token < covered; ++token) {
        if (!((mask[token >> 5] >> (token & 31)) & 1u)) logits[token] = negative_infinity;
    }
    std::fill(logits + covered, logits + vocabulary, negative_infinity);
}

// Rows of a C-contiguous (rows x vocabulary) logits buffer: logits row logit_rows[k] takes
// mask row mask_rows[k] of a C-contiguous (mask rows x words) bitmask.
template <typename Bits>
void apply_bitmask_rows(Bits* logits, int64_t vocabulary, const uint32_t* mask, int64_t words,
                        const int64_t* logit_rows, const int64_t* mask_rows, int64_t count,
                        int64_t width, Bits negative_infinity) {
    for (int64_t k = 0; k < count; ++k) {
        apply_bitmask_row(logits + logit_rows[k] * vocabulary, vocabulary,
                          mask + mask_rows[k] * words, words, width, negative_infinity);
    }
}

}  // namespace formline
