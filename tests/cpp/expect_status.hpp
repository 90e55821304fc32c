// The check every GoogleTest suite makes of a failing C ABI call: the
// status it returned and the fragments its last-error message must contain
// (the argument's name, what was expected, what was given).
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "hisparse/hisparse.h"

template <typename Fragments>
void expect_error_with(hs_status_t status, hs_status_t expected, const Fragments& fragments) {
  EXPECT_EQ(status, expected) << hs_status_string(status) << ": " << hs_last_error();
  const std::string message = hs_last_error();
  EXPECT_FALSE(message.empty());
  for (const char* fragment : fragments) {
    EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' missing in: " << message;
  }
}

inline void expect_error(hs_status_t status, hs_status_t expected, std::initializer_list<const char*> fragments) {
  expect_error_with(status, expected, fragments);
}

inline void expect_error(hs_status_t status, hs_status_t expected, const std::vector<const char*>& fragments) {
  expect_error_with(status, expected, fragments);
}
