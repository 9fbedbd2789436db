#include "web_assets.h"

namespace peertrain::cli {
namespace {

constexpr std::string_view kMarker = "<!--PEERTRAIN-SCRIPTS-->";

std::string with_scripts(const std::string& scripts) {
  std::string page(kDashboardHtml);
  const auto at = page.find(kMarker);
  return at == std::string::npos ? page : page.replace(at, kMarker.size(), scripts);
}

// Text inside <script>: "</" would end the element early (a string in the data, a comment).
std::string script_safe(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    out += text[i];
    if (text[i] == '<' && i + 1 < text.size() && text[i + 1] == '/') out += "\\";
  }
  return out;
}

}  // namespace

std::string dashboard_page_live() {
  return with_scripts("<script src=\"chart.js\"></script>\n<script src=\"dashboard.js\"></script>");
}

std::string dashboard_page_report(const std::string& run_json) {
  // Chart.js and the page's code contain no "</script": they are inlined as they are.
  return with_scripts("<script>" + std::string(kChartJs) + "</script>\n<script>window.PEERTRAIN_RUN = " +
                      script_safe(run_json) + ";</script>\n<script>" + std::string(kDashboardJs) + "</script>");
}

}  // namespace peertrain::cli
