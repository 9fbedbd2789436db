#include "dashboard_server.h"

#include <utility>  // before Asio: 1.74 uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <fcntl.h>

#include <chrono>
#include <deque>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "peertrain/core/error.h"
#include "peertrain/net/auth.h"
#include "web_assets.h"

namespace peertrain::cli {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

// The value of `key` in a request target's query ("/ws?token=abc" → "abc").
std::string query_value(std::string_view target, std::string_view key) {
  const auto q = target.find('?');
  if (q == std::string_view::npos) return {};
  std::string_view query = target.substr(q + 1);
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    if (pair.size() > key.size() && pair.substr(0, key.size()) == key && pair[key.size()] == '=')
      return std::string(pair.substr(key.size() + 1));
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return {};
}

std::string_view path_of(std::string_view target) { return target.substr(0, target.find('?')); }

// Compares in time independent of where the first difference is.
bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The children launch forks must not inherit the dashboard's sockets (a peer slow to exit
// would hold the port).
template <typename Socket>
void close_on_exec(Socket& socket) {
  if (socket.is_open()) ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);
}

bool is_loopback(const std::string& host) { return host == "127.0.0.1" || host == "::1" || host == "localhost"; }

const char* const kTokenPage = R"(<!doctype html><meta charset="utf-8"><title>peertrain dashboard</title>
<body style="font-family:sans-serif;margin:3em"><h1>peertrain dashboard</h1>
<p>This dashboard asks for a token: enter the one in the address that <code>peertrain launch</code> printed.</p>
<form method="get" action="/"><input name="token" size="40" autofocus> <button>Open</button></form></body>)";

}  // namespace

class WsSession;

class HttpSession;

// One connection's place in the per-address count: taken at accept, given back when the
// request, or the WebSocket it became, ends.
class AddressSlot {
 public:
  AddressSlot(std::map<std::string, std::size_t>& counts, std::string address)
      : counts_(counts), address_(std::move(address)) {
    ++counts_[address_];
  }
  ~AddressSlot() {
    if (--counts_[address_] == 0) counts_.erase(address_);
  }
  AddressSlot(const AddressSlot&) = delete;
  AddressSlot& operator=(const AddressSlot&) = delete;

 private:
  std::map<std::string, std::size_t>& counts_;
  std::string address_;
};

struct DashboardServer::State {
  static constexpr std::size_t kMaxConnections = 64;  // browsers and requests at once; more are closed
  // From one address other than this host's loopback: no stranger takes every slot.
  static constexpr std::size_t kMaxPerAddress = 16;

  // Before io: sessions still queued in io when it is destroyed leave these then.
  std::map<std::string, std::size_t> per_address;  // open connections by remote address
  std::set<HttpSession*> requests;
  DashboardOptions options;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer ticker{io}, accept_retry{io};
  std::thread thread;
  int port = 0;
  // The run so far; touched only on io's thread.
  std::vector<std::string> evals, events;
  std::string progress = "null", summary = "null";
  bool progress_dirty = false, stopping = false;
  long long seq = 0;
  std::set<std::shared_ptr<WsSession>> sessions;

  bool authorized(std::string_view target) const {
    return options.token.empty() || same_token(query_value(target, "token"), options.token);
  }
  // Bound to loopback, only requests addressed to it by name are served: a page on another
  // site that resolves its own name to 127.0.0.1 (DNS rebinding) is refused. A browser's
  // WebSocket must come from a page of this server (its Origin), not from another site.
  bool addressed_to_us(std::string_view host_header) const {
    if (!is_loopback(options.host)) return true;  // reachable by any name: the token guards it
    const std::string p = ":" + std::to_string(port);
    return host_header == "127.0.0.1" + p || host_header == "localhost" + p || host_header == "[::1]" + p;
  }
  std::size_t connections() const { return requests.size() + sessions.size(); }
  std::shared_ptr<const std::string> snapshot() {
    if (cached_snapshot && cached_version == version) return cached_snapshot;
    std::string s = "{\"type\":\"snapshot\",\"seq\":" + std::to_string(seq) + ",\"graph\":" + options.graph_json +
                    ",\"config\":" + options.config_json + ",\"evals\":[";
    for (std::size_t i = 0; i < evals.size(); ++i) s += (i ? "," : "") + evals[i];
    s += "],\"events\":[";
    for (std::size_t i = 0; i < events.size(); ++i) s += (i ? "," : "") + events[i];
    cached_snapshot =
        std::make_shared<const std::string>(s + "],\"progress\":" + progress + ",\"summary\":" + summary + "}");
    cached_version = version;
    return cached_snapshot;
  }
  // Every change of the state bumps version; browsers that ask at one version share one copy.
  long long version = 0, cached_version = -1;
  std::shared_ptr<const std::string> cached_snapshot;
  void broadcast(const char* type, const std::string& data);
  void accept();
  void tick();
  void stop_when_sent(std::chrono::steady_clock::time_point deadline);
  void stop();
};

// One browser's WebSocket: the snapshot first, then every update, through a bounded queue.
class WsSession : public std::enable_shared_from_this<WsSession> {
 public:
  WsSession(tcp::socket&& socket, DashboardServer::State& state, std::shared_ptr<AddressSlot> slot)
      : ws_(std::move(socket)), state_(state), slot_(std::move(slot)) {}

  void run(http::request<http::empty_body> request) {
    ws_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
    ws_.read_message_max(4096);  // the page sends only {"type":"resync"}
    ws_.async_accept(request, [self = shared_from_this()](beast::error_code ec) {
      if (ec || self->state_.stopping) return;
      self->state_.sessions.insert(self);
      self->needs_snapshot_ = true;
      self->write_next();
      self->read();
    });
  }

  void send(const std::shared_ptr<const std::string>& message) {
    if (closed_) return;
    if (queue_.size() >= DashboardServer::kMaxQueued) {
      // Behind: drop what waits (not the message being written) and catch up in one go.
      queue_.erase(queue_.begin() + (writing_ ? 1 : 0), queue_.end());
      needs_snapshot_ = true;
      return;
    }
    queue_.push_back(message);
    if (!writing_) write_next();
  }

  bool idle() const { return closed_ || (queue_.empty() && !writing_ && !needs_snapshot_); }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    beast::get_lowest_layer(ws_).socket().close(ignored);
    state_.sessions.erase(shared_from_this());
  }

 private:
  void write_next() {
    if (closed_) return;
    if (needs_snapshot_ && (queue_.empty() || !writing_)) {
      needs_snapshot_ = false;
      queue_.clear();
      queue_.push_back(state_.snapshot());
    }
    if (queue_.empty()) {
      writing_ = false;
      return;
    }
    writing_ = true;
    ws_.text(true);
    ws_.async_write(asio::buffer(*queue_.front()), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (!self->queue_.empty()) self->queue_.pop_front();
      self->writing_ = false;
      if (ec) return self->close();
      self->write_next();
    });
  }

  void read() {
    ws_.async_read(buffer_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->close();  // closed, a protocol error, a message over the limit
      const std::string text = beast::buffers_to_string(self->buffer_.data());
      self->buffer_.consume(self->buffer_.size());
      // Anything but a resync request is ignored: a browser cannot steer the run.
      if (text.find("\"resync\"") != std::string::npos) {
        self->needs_snapshot_ = true;
        if (!self->writing_) self->write_next();
      }
      self->read();
    });
  }

  websocket::stream<beast::tcp_stream> ws_;
  DashboardServer::State& state_;
  std::shared_ptr<AddressSlot> slot_;
  beast::flat_buffer buffer_;
  std::deque<std::shared_ptr<const std::string>> queue_;
  bool writing_ = false, needs_snapshot_ = false, closed_ = false;
};

// One HTTP request: the page, its scripts, the state as JSON, or the upgrade to /ws.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket&& socket, DashboardServer::State& state, std::shared_ptr<AddressSlot> slot)
      : stream_(std::move(socket)), state_(state), slot_(std::move(slot)) {
    state_.requests.insert(this);
  }
  ~HttpSession() { state_.requests.erase(this); }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  void run() {
    parser_.emplace();
    parser_->header_limit(8192);
    stream_.expires_after(std::chrono::seconds(10));
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      self->respond(self->parser_->release());
    });
  }

 private:
  void respond(http::request<http::empty_body> request) {
    const std::string target(request.target());
    const std::string_view path = path_of(target);
    const std::string host(request[http::field::host]), origin(request[http::field::origin]);
    if (!state_.addressed_to_us(host))
      return reply(request, http::status::forbidden, "text/plain", "this dashboard answers only to its own address\n");
    if (websocket::is_upgrade(request)) {
      if (!origin.empty() && origin != "http://" + host)
        return reply(request, http::status::forbidden, "text/plain", "another site's page\n");
      if (path != "/ws" || !state_.authorized(target))
        return reply(request, http::status::unauthorized, "text/plain", "no");
      stream_.expires_never();
      std::make_shared<WsSession>(stream_.release_socket(), state_, slot_)->run(std::move(request));
      return;
    }
    if (request.method() != http::verb::get && request.method() != http::verb::head)
      return reply(request, http::status::method_not_allowed, "text/plain", "GET only\n");
    if (path == "/" || path == "/index.html") {
      if (!state_.authorized(target)) return reply(request, http::status::unauthorized, "text/html", kTokenPage);
      return reply(request, http::status::ok, "text/html; charset=utf-8", dashboard_page_live());
    }
    if (path == "/dashboard.js") return reply(request, http::status::ok, "text/javascript", std::string(kDashboardJs));
    if (path == "/chart.js") return reply(request, http::status::ok, "text/javascript", std::string(kChartJs));
    if (path == "/state") {
      if (!state_.authorized(target)) return reply(request, http::status::unauthorized, "text/plain", "token\n");
      return reply(request, http::status::ok, "application/json", *state_.snapshot());
    }
    reply(request, http::status::not_found, "text/plain", "not found\n");
  }

  void reply(const http::request<http::empty_body>& request, http::status status, const char* type, std::string body) {
    auto response = std::make_shared<http::response<http::string_body>>(status, request.version());
    response->set(http::field::server, "peertrain");
    response->set(http::field::content_type, type);
    response->set(http::field::cache_control, "no-store");
    response->keep_alive(false);
    response->body() = request.method() == http::verb::head ? std::string() : std::move(body);
    response->prepare_payload();
    http::async_write(stream_, *response,
                      [self = shared_from_this(), response](beast::error_code, std::size_t) { self->close(); });
  }

  beast::tcp_stream stream_;
  DashboardServer::State& state_;
  std::shared_ptr<AddressSlot> slot_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> parser_;
};

void DashboardServer::State::broadcast(const char* type, const std::string& data) {
  ++seq;
  ++version;
  auto message = std::make_shared<const std::string>(std::string("{\"type\":\"") + type +
                                                     "\",\"seq\":" + std::to_string(seq) + ",\"data\":" + data + "}");
  const auto all = sessions;  // a failed send closes its session, which leaves the set
  for (const auto& s : all) s->send(message);
}

void DashboardServer::State::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (stopping) return;
    if (ec) {
      // Out of descriptors, say: wait before trying again rather than spin on a core.
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](beast::error_code e) {
        if (!e && !stopping) accept();
      });
      return;
    }
    close_on_exec(socket);
    beast::error_code peer_ec;
    const auto remote = socket.remote_endpoint(peer_ec).address();
    const std::string address = peer_ec ? std::string() : remote.to_string();
    const auto from_here = per_address.find(address);
    const bool address_full =
        !peer_ec && !remote.is_loopback() && from_here != per_address.end() && from_here->second >= kMaxPerAddress;
    if (!peer_ec && connections() < kMaxConnections && !address_full) {
      std::make_shared<HttpSession>(std::move(socket), *this, std::make_shared<AddressSlot>(per_address, address))
          ->run();
    } else {
      beast::error_code ignored;
      socket.close(ignored);
    }
    accept();
  });
}

void DashboardServer::State::tick() {
  ticker.expires_after(std::chrono::milliseconds(200));
  ticker.async_wait([this](beast::error_code ec) {
    if (ec || stopping) return;
    if (progress_dirty) {
      progress_dirty = false;
      broadcast("progress", progress);
    }
    tick();
  });
}

// The end of the run: let every browser take what is queued for it (the summary), up to the
// deadline, then close.
void DashboardServer::State::stop_when_sent(std::chrono::steady_clock::time_point deadline) {
  bool sent = true;
  for (const auto& s : sessions) sent = sent && s->idle();
  if (sent || std::chrono::steady_clock::now() >= deadline) return stop();
  ticker.expires_after(std::chrono::milliseconds(20));
  ticker.async_wait([this, deadline](beast::error_code) { stop_when_sent(deadline); });
}

void DashboardServer::State::stop() {
  stopping = true;
  beast::error_code ignored;
  acceptor.close(ignored);
  ticker.cancel();
  accept_retry.cancel();
  const auto all = sessions;
  for (const auto& s : all) s->close();
  const auto pending = requests;
  for (HttpSession* r : pending) r->close();
}

DashboardOptions parse_dashboard_address(const std::string& text) {
  DashboardOptions o;
  std::string port = text;
  if (const auto colon = text.rfind(':'); colon != std::string::npos) {
    o.host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (o.host.size() >= 2 && o.host.front() == '[' && o.host.back() == ']')
      o.host = o.host.substr(1, o.host.size() - 2);
  }
  const bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || std::stoi(port) > 65535 || o.host.empty())
    throw Error(ErrorKind::kInvalidArgument,
                str("--dashboard '", text, "': expected [HOST:]PORT, e.g. 8080 or 0.0.0.0:8080 (port 0..65535)"));
  o.port = std::stoi(port);
  boost::system::error_code ec;
  asio::ip::make_address(o.host, ec);
  if (ec && o.host != "localhost")
    throw Error(ErrorKind::kInvalidArgument, str("--dashboard '", text, "': '", o.host, "' is not an IP address"));
  if (o.host == "localhost") o.host = "127.0.0.1";
  return o;
}

DashboardServer::DashboardServer(DashboardOptions options) : state_(std::make_shared<State>()) {
  state_->options = std::move(options);
  State& s = *state_;
  // Reachable from other machines, it always asks for a token, with a key or without.
  if (s.options.token.empty() && !is_loopback(s.options.host))
    s.options.token = net::Secret::generate().hex().substr(0, 32);
  const std::string where = str(s.options.host, ":", s.options.port);
  try {
    const tcp::endpoint endpoint(asio::ip::make_address(s.options.host), static_cast<unsigned short>(s.options.port));
    s.acceptor.open(endpoint.protocol());
    s.acceptor.set_option(asio::socket_base::reuse_address(true));
    s.acceptor.bind(endpoint);
    s.acceptor.listen();
    close_on_exec(s.acceptor);
    s.port = s.acceptor.local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    throw Error(ErrorKind::kIo, str("--dashboard ", where, ": cannot listen: ", e.code().message()));
  }
  s.accept();
  s.tick();
  s.thread = std::thread([&s] {
    for (;;) {
      try {
        s.io.run();
        return;
      } catch (const std::exception&) {
        // A browser's connection must never end the run: drop what failed, serve on.
      }
    }
  });
}

DashboardServer::~DashboardServer() {
  State& s = *state_;
  asio::post(s.io, [&s] {
    s.ticker.cancel();
    s.stop_when_sent(std::chrono::steady_clock::now() + std::chrono::seconds(1));
  });
  // Closing every socket ends every handler; a write that still hangs is cut off.
  auto done = std::async(std::launch::async, [&s] { s.thread.join(); });
  if (done.wait_for(std::chrono::seconds(3)) != std::future_status::ready) s.io.stop();
  done.wait();
}

int DashboardServer::port() const { return state_->port; }

std::string DashboardServer::url() const {
  const std::string& host = state_->options.host;
  const std::string shown = host == "0.0.0.0"                     ? "127.0.0.1"
                            : host.find(':') != std::string::npos ? "[" + host + "]"
                                                                  : host;
  return str("http://", shown, ":", state_->port, "/",
             state_->options.token.empty() ? "" : "?token=", state_->options.token);
}

void DashboardServer::progress(std::string json) {
  asio::post(state_->io, [s = state_.get(), json = std::move(json)]() mutable {
    s->progress = std::move(json);
    s->progress_dirty = true;
    ++s->version;
  });
}

void DashboardServer::eval(std::string json) {
  asio::post(state_->io, [s = state_.get(), json = std::move(json)]() mutable {
    s->evals.push_back(json);  // first: a snapshot made from here on holds it
    ++s->version;
    s->broadcast("eval", json);
  });
}

void DashboardServer::event(std::string json) {
  asio::post(state_->io, [s = state_.get(), json = std::move(json)]() mutable {
    s->events.push_back(json);
    ++s->version;
    s->broadcast("event", json);
  });
}

void DashboardServer::finish(std::string summary_json) {
  asio::post(state_->io, [s = state_.get(), json = std::move(summary_json)]() mutable {
    if (s->progress_dirty) {
      s->progress_dirty = false;
      s->broadcast("progress", s->progress);
    }
    s->summary = json;
    ++s->version;
    s->broadcast("summary", s->summary);
  });
}

}  // namespace peertrain::cli
