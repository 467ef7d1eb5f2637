// EXPECT_EPKIT_ERROR(statement, "part", ...): the statement throws epkit::Error, and its message
// holds every part (the bad value and the limit it broke).
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "epkit/error.hpp"

#define EXPECT_EPKIT_ERROR(stmt, ...)                                                                  \
  do {                                                                                                 \
    try {                                                                                              \
      stmt;                                                                                            \
      ADD_FAILURE() << "no epkit::Error from " #stmt;                                                  \
    } catch (const ::epkit::Error& _e) {                                                               \
      const std::string _w = _e.what();                                                                \
      for (const char* _part : std::initializer_list<const char*>{__VA_ARGS__})                        \
        EXPECT_NE(_w.find(_part), std::string::npos) << "message '" << _w << "' lacks '" << _part << "'"; \
    }                                                                                                  \
  } while (0)
