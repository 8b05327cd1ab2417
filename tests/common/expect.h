// Shared assertions for qkv tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

// Asserts that `expr` throws E and that its message contains `text`.
#define EXPECT_THROW_WITH(expr, E, text)                                                            \
  do {                                                                                              \
    try {                                                                                           \
      (void)(expr);                                                                                 \
      ADD_FAILURE() << "expected " #E " from " #expr;                                               \
    } catch (const E& qkv_error_) {                                                                 \
      EXPECT_NE(std::string(qkv_error_.what()).find(text), std::string::npos) << qkv_error_.what(); \
    }                                                                                               \
  } while (0)
