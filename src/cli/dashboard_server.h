// The live dashboard of `launch --dashboard [HOST:]PORT`: an HTTP and WebSocket server
// (Boost.Beast) on a thread of its own, serving the page (web/, compiled in) and pushing
// the run to every browser as it happens.
//
// What it shows comes from the stream launch already reads: the coordinator's "@progress"
// and "@eval" lines (train/recorder.h) and launch's own view of its children (a peer that
// exited). Nothing is added between the peers.
//
// It never slows training: launch hands each line over with a post to the server's thread
// and goes on. Each browser has a queue of at most kMaxQueued messages; a browser that
// falls behind (slow, or gone without closing) has its queue dropped and gets one fresh
// snapshot when it can take it again. Progress lines are coalesced to at most five a
// second. A malformed message from a browser is ignored; a broken connection closes that
// browser only.
#pragma once

#include <memory>
#include <string>

namespace peertrain::cli {

struct DashboardOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 0;                    // 0: any free port
  std::string token;               // non-empty: every request must carry ?token=
  std::string graph_json;          // train::graph_json of the topology
  std::string config_json;         // the run's configuration, as the page shows it
};

// "[HOST:]PORT" as given to --dashboard; throws Error naming the flag and the text.
DashboardOptions parse_dashboard_address(const std::string& text);

class DashboardServer {
 public:
  static constexpr std::size_t kMaxQueued = 64;

  // Binds and starts serving; throws Error(kIo) naming HOST:PORT when it cannot bind.
  explicit DashboardServer(DashboardOptions options);
  ~DashboardServer();  // closes every connection and joins the thread
  DashboardServer(const DashboardServer&) = delete;
  DashboardServer& operator=(const DashboardServer&) = delete;

  int port() const;
  std::string url() const;  // http://HOST:PORT/ (with ?token=… when there is one)

  // Thread-safe and non-blocking: each is posted to the server's thread.
  void progress(std::string json);  // an "@progress" object
  void eval(std::string json);      // an "@eval" object
  void event(std::string json);     // {"kind": "lost" | "finished" | "failed", ...}
  void finish(std::string summary_json);

  struct State;  // the server's side (dashboard_server.cpp), shared with its connections

 private:
  std::shared_ptr<State> state_;
};

}  // namespace peertrain::cli
