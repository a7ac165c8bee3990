// Online bin packing, the heuristic of examples/bin_packing/policy.py written in C++.
//
// Reads from stdin: "CAPACITY N" then N item sizes. Packs the items online, in order: each item goes to the
// open bin (with room for it) of the highest priority, or to a new bin when the new bin's priority is highest
// (ties: the bin opened first, a new bin last), exactly as examples/bin_packing/evaluate.py's pack() does with
// policy.py's priority(). Prints, on one line, the bin each item went to (bins numbered from 0 in opening order).
//
// The seven numbers between the EVOLVE-BLOCK markers are ratchet's parameters (names and bounds in the
// annotations): at these values the heuristic is best fit.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "priority.h"

// EVOLVE-BLOCK-START
const double TIGHT_GAP = 0.02;      // ratchet: tight_gap 0..0.1
const double TIGHT_BONUS = 0.0;     // ratchet: tight_bonus 0..1
const double DEAD_GAP = 0.15;       // ratchet: dead_gap 0..0.5
const double DEAD_PENALTY = 0.0;    // ratchet: dead_penalty 0..1
const double SPREAD_GAP = 0.5;      // ratchet: spread_gap 0..1
const double SPREAD_WEIGHT = 0.0;   // ratchet: spread_weight 0..3
const double NEW_BIN_BONUS = 0.0;   // ratchet: new_bin_bonus -1..1
// EVOLVE-BLOCK-END

int main() {
    const Weights w{TIGHT_GAP, TIGHT_BONUS, DEAD_GAP, DEAD_PENALTY, SPREAD_GAP, SPREAD_WEIGHT, NEW_BIN_BONUS};
    double capacity;
    long n;
    if (std::scanf("%lf %ld", &capacity, &n) != 2 || n < 0) return 2;
    std::vector<double> rem;  // remaining capacity of the open bins, in opening order
    std::vector<long> out(n);
    for (long i = 0; i < n; ++i) {
        double item;
        if (std::scanf("%lf", &item) != 1) return 2;
        long best = -1;
        double best_score = 0.0;
        for (long b = 0; b < (long)rem.size(); ++b) {
            if (rem[b] < item) continue;
            double s = priority(item, rem[b], capacity, false, w);
            if (best < 0 || s > best_score) { best = b; best_score = s; }
        }
        double s_new = priority(item, capacity, capacity, true, w);
        if (best < 0 || s_new > best_score) {
            rem.push_back(capacity - item);
            out[i] = (long)rem.size() - 1;
        } else {
            rem[best] -= item;
            out[i] = best;
        }
    }
    for (long i = 0; i < n; ++i) std::printf(i ? " %ld" : "%ld", out[i]);
    std::printf("\n");
    return 0;
}
