// The priority of one candidate bin: policy.py's priority() for one entry of bins.
#pragma once
#include <algorithm>

struct Weights {
    double tight_gap, tight_bonus, dead_gap, dead_penalty, spread_gap, spread_weight, new_bin_bonus;
};

// remaining: the bin's remaining capacity (the capacity itself for the new bin); all scores in capacity units.
inline double priority(double item, double remaining, double capacity, bool new_bin, const Weights& w) {
    double gap = (remaining - item) / capacity;  // what would be left
    double score = -gap;                         // best fit
    bool tight = gap <= w.tight_gap;
    score = score + (tight ? w.tight_bonus : 0.0);
    bool dead = !tight && gap <= w.dead_gap;
    score = score - (dead ? w.dead_penalty : 0.0);
    score = score + w.spread_weight * std::max(gap - w.spread_gap, 0.0);
    if (new_bin) score += w.new_bin_bonus;
    return score;
}
