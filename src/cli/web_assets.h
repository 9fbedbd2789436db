// The dashboard's page (web/dashboard.html and web/dashboard.js) and Chart.js (Debian's
// libjs-chart.js), compiled into the program by cmake/EmbedWeb.cmake, so the live page and
// the report need no network and no files beside the binary.
#pragma once

#include <string>
#include <string_view>

namespace peertrain::cli {

extern const std::string_view kDashboardHtml;  // with a <!--PEERTRAIN-SCRIPTS--> marker
extern const std::string_view kDashboardJs;
extern const std::string_view kChartJs;  // empty when libjs-chart.js was missing at build time

// The live page: scripts loaded from the server (/chart.js, /dashboard.js).
std::string dashboard_page_live();
// One self-contained file: the scripts and the run (a JSON object, see dashboard.js's
// loadReport) inline.
std::string dashboard_page_report(const std::string& run_json);

}  // namespace peertrain::cli
