// Helpers shared by the topology tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "peertrain/core/error.h"

// Runs `statement`, expects a peertrain::Error, and checks that its message contains
// every one of `parts` (the input's name, the place, what was wrong).
#define EXPECT_ERROR_MENTIONS(statement, ...)                                       \
  do {                                                                              \
    try {                                                                           \
      statement;                                                                    \
      ADD_FAILURE() << "no error from: " #statement;                                \
    } catch (const ::peertrain::Error& error_) {                                    \
      const std::string message_ = error_.what();                                   \
      for (const char* part_ : {__VA_ARGS__})                                       \
        EXPECT_NE(message_.find(part_), std::string::npos)                          \
            << "message lacks '" << part_ << "': " << message_;                     \
    }                                                                               \
  } while (false)
