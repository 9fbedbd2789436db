// What a stranger can cost a peer: the handshakes open at once are capped in total and per
// source address, and refusals are logged at most once per interval with a count, so a
// flood of connections costs neither memory nor a log line per connection. I/O thread only.
#pragma once

#include <chrono>
#include <map>
#include <string>

namespace peertrain::net {

// Lets one line through per interval and counts the rest, which the next line reports.
class RateLimitedLine {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RateLimitedLine(double interval_s) : interval_(std::chrono::duration<double>(interval_s)) {}
  // True when a line should be written now; `suppressed` then holds how many were held back.
  bool ready(long long& suppressed) {
    const auto now = Clock::now();
    if (started_ && now - last_ < interval_) {
      ++held_;
      return false;
    }
    suppressed = held_;
    held_ = 0;
    last_ = now;
    started_ = true;
    return true;
  }

 private:
  std::chrono::duration<double> interval_;
  Clock::time_point last_;
  bool started_ = false;
  long long held_ = 0;
};

class Admission {
 public:
  Admission(int max_total, int max_per_address) : max_total_(max_total), max_per_address_(max_per_address) {}
  // Takes a handshake slot for `address`, or says why not.
  bool admit(const std::string& address, std::string& why) {
    int& mine = pending_[address];
    if (total_ >= max_total_) why = "too many handshakes open at once";
    else if (mine >= max_per_address_) why = "too many handshakes open from " + address;
    else {
      ++mine;
      ++total_;
      return true;
    }
    if (mine == 0) pending_.erase(address);
    ++refused_;
    return false;
  }
  void release(const std::string& address) {
    auto it = pending_.find(address);
    if (it == pending_.end()) return;
    --total_;
    if (--it->second == 0) pending_.erase(it);
  }
  int pending() const { return total_; }
  long long refused() const { return refused_; }

 private:
  int max_total_, max_per_address_;
  int total_ = 0;
  long long refused_ = 0;
  std::map<std::string, int> pending_;
};

}  // namespace peertrain::net
