#include "fp8lab/core/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace fp8lab {

Progress::Progress(std::string label, std::int64_t total, std::string unit, std::int64_t first)
    : label_(std::move(label)), unit_(std::move(unit)), total_(std::max<std::int64_t>(total, 1)), done_(first), first_(first),
      tty_(::isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

void Progress::update(std::int64_t done, const std::string& extra) {
  done_ = done;
  extra_ = extra;
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    draw(false);
  } else {
    const int decile = static_cast<int>(10 * done_ / total_);
    if (decile != last_decile_) {
      last_decile_ = decile;
      draw(false);
    }
  }
}

void Progress::finish(const std::string& extra) {
  done_ = total_;
  if (!extra.empty()) extra_ = extra;
  draw(true);
}

std::string rate_text(double per_second, const std::string& unit) {
  double rate = per_second;
  const char* per = "s";
  if (rate > 0 && rate < 1) rate *= 60, per = "min";
  if (rate > 0 && rate < 1) rate *= 60, per = "h";
  char buf[128];
  std::snprintf(buf, sizeof buf, "%.1f %s/%s", rate, unit.c_str(), per);
  return buf;
}

void Progress::draw(bool final) {
  const double secs = seconds_since(start_);
  const double rate = secs > 0 ? (done_ - first_) / secs : 0;
  const double eta = rate > 0 ? (total_ - done_) / rate : 0;
  const int width = 24;
  const int fill = static_cast<int>(width * done_ / total_);
  std::string bar(static_cast<std::size_t>(fill), '#');
  bar.append(static_cast<std::size_t>(width - fill), '.');
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s [%s] %lld/%lld %s  %s  %s %02d:%02d  %s", label_.c_str(),
                bar.c_str(), static_cast<long long>(done_), static_cast<long long>(total_),
                unit_.c_str(), rate_text(rate, unit_).c_str(), final ? "took" : "ETA",
                static_cast<int>((final ? secs : eta) / 60), static_cast<int>(final ? secs : eta) % 60,
                extra_.c_str());
  if (tty_) std::fprintf(stderr, "\r\033[K%s%s", buf, final ? "\n" : "");
  else std::fprintf(stderr, "%s\n", buf);
  std::fflush(stderr);
}

}  // namespace fp8lab
