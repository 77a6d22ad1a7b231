// A progress bar for long work: items done, rate, ETA and a few named figures, redrawn in
// place on a terminal, or a line every 10 % when stderr is not one.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace fp8lab {

// Seconds on the steady clock since `t0`.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A rate as the bar prints it, in the largest unit of time that gives at least one item:
// "12.3 steps/s", "2.4 runs/min" (slower than 1 a second), "1.5 runs/h" (slower than 1 a
// minute); "0.0 runs/s" before anything is done.
std::string rate_text(double per_second, const std::string& unit);

class Progress {
 public:
  // `first`: the count already done when the bar starts (a resumed run); the rate counts
  // only what this bar saw.
  Progress(std::string label, std::int64_t total, std::string unit = "steps", std::int64_t first = 0);
  // Sets the count done and the extra text (e.g. "loss 0.41 scale 2^12"); redraws at most
  // ten times a second.
  void update(std::int64_t done, const std::string& extra = "");
  void finish(const std::string& extra = "");

 private:
  void draw(bool final);
  std::string label_, unit_, extra_;
  std::int64_t total_, done_ = 0, first_ = 0;
  int last_decile_ = -1;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace fp8lab
