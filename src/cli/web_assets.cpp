#include "web_assets.h"

namespace peertrain::cli {
namespace {

constexpr std::string_view kMarker = "<!--PEERTRAIN-SCRIPTS-->";

std::string with_scripts(const std::string& scripts) {
  std::string page(kDashboardHtml);
  const auto at = page.find(kMarker);
  return at == std::string::npos ? page : page.replace(at, kMarker.size(), scripts);
}

// JSON inside <script>: "</script", "<!--" and "<script" would change how the HTML parser
// reads the element (a string in a topology name or an error message), so every '<'
// becomes \u003c, which JSON reads back as the same character ('<' occurs only inside
// strings in JSON).
std::string script_safe(std::string_view json) {
  std::string out;
  out.reserve(json.size());
  for (char c : json) {
    if (c == '<')
      out += "\\u003c";
    else
      out += c;
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
