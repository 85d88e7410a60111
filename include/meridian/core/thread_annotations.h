// Clang thread-safety annotations (-Wthread-safety). Under other compilers
// they expand to nothing. Annotate every field shared between threads with
// the mutex that guards it (GUARDED_BY), and every function that expects a
// lock held (REQUIRES) or not held (EXCLUDES); the analysis then checks the
// locking at compile time. Use meridian::Mutex (mutex.h): std::mutex carries
// no annotations in libstdc++.
#ifndef MERIDIAN_CORE_THREAD_ANNOTATIONS_H_
#define MERIDIAN_CORE_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define MERIDIAN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define MERIDIAN_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) MERIDIAN_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY MERIDIAN_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) MERIDIAN_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) MERIDIAN_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) \
  MERIDIAN_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) \
  MERIDIAN_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define REQUIRES(...) \
  MERIDIAN_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) \
  MERIDIAN_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define ACQUIRE(...) MERIDIAN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) \
  MERIDIAN_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) MERIDIAN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) \
  MERIDIAN_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) \
  MERIDIAN_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) \
  MERIDIAN_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) MERIDIAN_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) MERIDIAN_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) MERIDIAN_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS \
  MERIDIAN_THREAD_ANNOTATION(no_thread_safety_analysis)

#endif  // MERIDIAN_CORE_THREAD_ANNOTATIONS_H_
