#pragma once
// gtest checks for the library's internal Status and Result<T>. A failed check prints the
// expression with the status's code and message, where ASSERT_TRUE(s.is_ok()) printed only
// "false".
//
//   STRATA_ASSERT_OK(heap->free(p));
//   STRATA_EXPECT_OK(result) << "while doing X";

#include <gtest/gtest.h>

#include "common/status.hpp"

namespace strata::test {

/// The status of a Status (itself).
inline const Status& status_of(const Status& s) { return s; }

/// The status of a Result<T>.
template <class T>
const Status& status_of(const Result<T>& r) {
  return r.status();
}

/// gtest predicate formatter: success when `value` (a Status or a Result<T>) is ok, else a
/// failure naming `expr` and the status ("expr is Timeout: waiting for ...").
template <class S>
::testing::AssertionResult status_is_ok(const char* expr, const S& value) {
  const Status& s = status_of(value);
  if (s.is_ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expr << " is " << s.to_string();
}

}  // namespace strata::test

/// Fatal check that a Status or Result<T> is ok; accepts `<< context` like ASSERT_TRUE.
#define STRATA_ASSERT_OK(status_or_result) ASSERT_PRED_FORMAT1(::strata::test::status_is_ok, status_or_result)
/// Non-fatal form of STRATA_ASSERT_OK.
#define STRATA_EXPECT_OK(status_or_result) EXPECT_PRED_FORMAT1(::strata::test::status_is_ok, status_or_result)
