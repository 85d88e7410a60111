// Eigen in the precompiled header (CMakeLists.txt, MERIDIAN_PRECOMPILED_HEADERS),
// only where the target has Eigen's include path: a target without it
// includes the precompiled header as text when the compiler cannot use the
// binary form.
#pragma once
#if __has_include(<Eigen/Core>)
#include <Eigen/Core>
#endif
