// The contract every bitparity fuzz target checks: a parser given any bytes either
// returns or throws bp::io::BadInput with a one-line message. Anything else (another
// exception, a broken invariant) aborts, which libFuzzer records as a crash.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "harness/io/errors.h"

namespace bp::fuzz {

[[noreturn]] inline void fail(const char* what, const char* detail) {
  std::fprintf(stderr, "fuzz contract broken: %s: %s\n", what, detail);
  std::abort();
}

inline void require(bool ok, const char* what) {
  if (!ok) fail(what, "invariant does not hold");
}

// Runs `body`; a BadInput is the expected refusal (its message must be one line),
// any other exception is a finding.
template <class Body>
void allow_bad_input(Body&& body) {
  try {
    body();
  } catch (const bp::io::BadInput& e) {
    for (const char* c = e.what(); *c; ++c)
      if (static_cast<unsigned char>(*c) < 0x20) fail("BadInput message is not one printable line", e.what());
  } catch (const std::exception& e) {
    fail("an exception other than BadInput escaped", e.what());
  } catch (...) {
    fail("a non-standard exception escaped", "?");
  }
}

// Whether `body` threw BadInput (an expected refusal, checked as above); false if it
// returned.
template <class Body>
bool refused(Body&& body) {
  bool threw = true;
  allow_bad_input([&] {
    body();
    threw = false;
  });
  return threw;
}

// Runs `body`, which must not throw at all (e.g. re-reading what a parser accepted).
template <class Body>
void must_not_throw(const char* what, Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    fail(what, e.what());
  } catch (...) {
    fail(what, "a non-standard exception");
  }
}

}  // namespace bp::fuzz
