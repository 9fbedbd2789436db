// RunClock (the steady clock, or an installed one for the whole process), the FLOP count a
// simulated cluster charges, and Work's drive hook (a backend that progresses only while
// its waiter lets it).
#include "peertrain/core/clock.h"

#include <gtest/gtest.h>

#include <memory>

#include "peertrain/core/error.h"
#include "peertrain/core/work.h"

namespace peertrain {
namespace {

double g_fake_now = 0;
double fake_clock() { return g_fake_now; }

TEST(RunClock, ReadsTheInstalledClockAndGoesBackToTheSteadyOne) {
  EXPECT_FALSE(RunClock::simulated());
  const auto steady_before = RunClock::now();
  RunClock::install(&fake_clock);
  EXPECT_TRUE(RunClock::simulated());
  g_fake_now = 12.5;
  const auto start = RunClock::now();
  g_fake_now = 20.0;
  EXPECT_DOUBLE_EQ(seconds_since(start), 7.5);
  RunClock::install(nullptr);
  EXPECT_FALSE(RunClock::simulated());
  EXPECT_GE(seconds_since(steady_before), 0.0);
}

TEST(CountedFlops, AreTakenOnceAndAddUp) {
  take_counted_flops();
  count_flops(1e6);
  count_flops(2.5e6);
  EXPECT_DOUBLE_EQ(take_counted_flops(), 3.5e6);
  EXPECT_DOUBLE_EQ(take_counted_flops(), 0.0);
}

TEST(WorkDrive, AWaitDrivesTheOperationToItsEnd) {
  auto state = std::make_shared<Work::State>("a simulated send");
  int driven = 0;
  Work::State* s = state.get();
  state->drive = [&driven, s](double) {
    if (++driven == 1) s->complete();
  };
  Work work(std::move(state));
  work.wait(5.0);
  EXPECT_EQ(driven, 1);
  EXPECT_TRUE(work.done());
}

TEST(WorkDrive, AnOperationTheDriveDoesNotEndTimesOutAndIsCancelled) {
  auto state = std::make_shared<Work::State>("a simulated send to peer 3");
  bool cancelled = false;
  double asked = -1;
  state->drive = [&asked](double timeout_s) { asked = timeout_s; };
  state->cancel = [&cancelled] {
    cancelled = true;
    return true;
  };
  Work work(std::move(state));
  try {
    work.wait(2.0);
    FAIL() << "wait() returned for an operation that never ended";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
    EXPECT_NE(std::string(e.what()).find("a simulated send to peer 3"), std::string::npos) << e.what();
  }
  EXPECT_DOUBLE_EQ(asked, 2.0);
  EXPECT_TRUE(cancelled);
}

}  // namespace
}  // namespace peertrain
