// Linked into every GoogleTest binary (tests/CMakeLists.txt): MakeTempDir's
// directories are removed at exit only when every test passed.
#include <gtest/gtest.h>

#include "testing/test_data.h"

namespace meridian::testing {
namespace {

bool EveryTestPassed() {
  // MakeTempDir's registry is made after gtest's UnitTest singleton (on
  // the first call, inside a test), so the singleton outlives the check.
  return ::testing::UnitTest::GetInstance()->Passed();
}

const bool kRegistered = (SetTempDirCleanupCheck(&EveryTestPassed), true);

}  // namespace
}  // namespace meridian::testing
