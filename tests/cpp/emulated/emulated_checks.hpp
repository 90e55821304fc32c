// What the emulated kernel tests share: random integers, and the comparison
// of a kernel's output with the reference's, reporting the first element
// that differs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace hisparse {
namespace emulated {

inline int uniform(std::mt19937& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

template <class T>
void expect_same(const std::vector<T>& reference, const std::vector<T>& kernel, const std::string& where) {
  ASSERT_EQ(reference.size(), kernel.size()) << where;
  const auto at = std::mismatch(reference.begin(), reference.end(), kernel.begin());
  EXPECT_TRUE(at.first == reference.end()) << "element " << (at.first - reference.begin()) << " differs (reference "
                                           << +*at.first << ", kernel " << +*at.second << "), " << where;
}

}  // namespace emulated
}  // namespace hisparse
