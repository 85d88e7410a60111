#include "meridian/metrics/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

namespace meridian {
namespace {

bool IsNameStart(char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (allow_colon && c == ':');
}
bool IsNameChar(char c, bool allow_colon) {
  return IsNameStart(c, allow_colon) || (c >= '0' && c <= '9');
}

// `name` with every character a Prometheus name may not hold replaced by
// '_' (metric names may hold ':', label names may not).
std::string SanitizeName(std::string_view name, bool allow_colon) {
  std::string out(name);
  if (out.empty()) return "_";
  for (size_t i = 0; i < out.size(); ++i) {
    const bool ok = i == 0 ? IsNameStart(out[i], allow_colon)
                           : IsNameChar(out[i], allow_colon);
    if (!ok) out[i] = '_';
  }
  return out;
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// "{a=\"x\",b=\"y\"}" with names sorted, or "" without labels.
std::string RenderLabels(const MetricLabels& labels) {
  if (labels.empty()) return "";
  std::vector<std::pair<std::string, std::string>> sorted;
  sorted.reserve(labels.size());
  for (const auto& [key, value] : labels) {
    sorted.emplace_back(SanitizeName(key, false), value);
  }
  std::sort(sorted.begin(), sorted.end());
  std::string out = "{";
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i > 0) out += ',';
    out += sorted[i].first + "=\"" + EscapeLabelValue(sorted[i].second) + "\"";
  }
  return out + "}";
}

const char* TypeName(MetricType type) {
  return type == MetricType::kCounter ? "counter" : "gauge";
}

}  // namespace

void MetricCell::Add(double delta) {
  value_.fetch_add(delta, std::memory_order_relaxed);
}

MetricCell* MetricsRegistry::Counter(std::string_view name,
                                     std::string_view help,
                                     const MetricLabels& labels) {
  return Get(name, help, MetricType::kCounter, labels);
}

MetricCell* MetricsRegistry::Gauge(std::string_view name, std::string_view help,
                                   const MetricLabels& labels) {
  return Get(name, help, MetricType::kGauge, labels);
}

MetricCell* MetricsRegistry::Get(std::string_view name, std::string_view help,
                                 MetricType type, const MetricLabels& labels) {
  const std::string family_name = SanitizeName(name, true);
  const std::string key = RenderLabels(labels);
  MutexLock lock(&mu_);
  auto [it, inserted] = families_.try_emplace(family_name);
  Family& family = it->second;
  if (inserted) {
    family.help = std::string(help);
    family.type = type;
  }
  std::unique_ptr<MetricCell>& cell = family.series[key];
  if (!cell) cell = std::make_unique<MetricCell>();
  return cell.get();
}

std::string MetricsRegistry::RenderText() const {
  std::string out;
  MutexLock lock(&mu_);
  for (const auto& [name, family] : families_) {
    out += "# HELP " + name + " " + EscapeHelp(family.help) + "\n";
    out += "# TYPE " + name + " " + TypeName(family.type) + "\n";
    for (const auto& [labels, cell] : family.series) {
      out += name + labels + " " + FormatMetricValue(cell->value()) + "\n";
    }
  }
  return out;
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto [end, error] = std::to_chars(buf, buf + sizeof(buf), value);
  if (error != std::errc()) return "NaN";
  return std::string(buf, end);
}

std::string MetricSample::Label(std::string_view key) const {
  for (const auto& [name, value] : labels) {
    if (name == key) return value;
  }
  return "";
}

namespace {

// Parses one sample line; `error` says what is wrong.
bool ParseSampleLine(std::string_view line, MetricSample* sample,
                     std::string* error) {
  size_t i = 0;
  auto skip_spaces = [&] {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  };
  if (i >= line.size() || !IsNameStart(line[i], true)) {
    *error = "expected a metric name";
    return false;
  }
  const size_t name_start = i;
  while (i < line.size() && IsNameChar(line[i], true)) ++i;
  sample->name = std::string(line.substr(name_start, i - name_start));
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (true) {
      skip_spaces();
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      if (i >= line.size() || !IsNameStart(line[i], false)) {
        *error = "expected a label name or '}'";
        return false;
      }
      const size_t key_start = i;
      while (i < line.size() && IsNameChar(line[i], false)) ++i;
      std::string key(line.substr(key_start, i - key_start));
      if (i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"') {
        *error = "expected =\"value\" after label '" + key + "'";
        return false;
      }
      i += 2;
      std::string value;
      bool closed = false;
      while (i < line.size()) {
        const char c = line[i++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c == '\\') {
          if (i >= line.size()) break;
          const char escaped = line[i++];
          value += escaped == 'n' ? '\n' : escaped;
        } else {
          value += c;
        }
      }
      if (!closed) {
        *error = "unterminated value of label '" + key + "'";
        return false;
      }
      sample->labels.emplace_back(std::move(key), std::move(value));
      skip_spaces();
      if (i < line.size() && line[i] == ',') ++i;
    }
  }
  skip_spaces();
  const size_t value_start = i;
  while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
  const std::string_view text = line.substr(value_start, i - value_start);
  if (text == "NaN") {
    sample->value = std::nan("");
  } else if (text == "+Inf" || text == "Inf") {
    sample->value = HUGE_VAL;
  } else if (text == "-Inf") {
    sample->value = -HUGE_VAL;
  } else {
    const auto [end, ec] =
        std::from_chars(text.data(), text.data() + text.size(), sample->value);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
      *error = "expected a number after the name, got '" +
               std::string(text.substr(0, 40)) + "'";
      return false;
    }
  }
  return true;  // an optional timestamp may follow; it is ignored
}

}  // namespace

Result<std::vector<MetricSample>> ParseMetricsText(std::string_view text) {
  std::vector<MetricSample> samples;
  int line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view()
                                             : text.substr(newline + 1);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) {
      line.remove_suffix(1);
    }
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) {
      line.remove_prefix(1);
    }
    if (line.empty() || line.front() == '#') continue;
    MetricSample sample;
    std::string error;
    if (!ParseSampleLine(line, &sample, &error)) {
      return DataLossError("metrics line " + std::to_string(line_number) +
                           " ('" + std::string(line.substr(0, 80)) +
                           "'): " + error);
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::string MetricsAddress::ToString() const {
  return host + ":" + std::to_string(port);
}

Result<MetricsAddress> ParseMetricsAddress(std::string_view text) {
  const std::string original(text.substr(0, 200));
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("metrics address '" + original + "': " + why +
                                " (expected HOST:PORT, e.g. 127.0.0.1:9100; "
                                "port 0 picks a free one)");
  };
  if (text.rfind("http://", 0) == 0) text.remove_prefix(7);
  if (text.size() >= 8 && text.substr(text.size() - 8) == "/metrics") {
    text.remove_suffix(8);
  }
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return bad("no port");
  MetricsAddress out;
  out.host = std::string(text.substr(0, colon));
  if (out.host.empty()) return bad("empty host");
  if (out.host == "*") out.host = "0.0.0.0";
  for (char c : out.host) {
    if (static_cast<unsigned char>(c) <= ' ' || c == '/' || c == ':' ||
        c == '[' || c == ']' || c == '"') {
      return bad("bad character in host");
    }
  }
  const std::string_view port = text.substr(colon + 1);
  int value = -1;
  const auto [end, ec] =
      std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() ||
      value < 0 || value > 65535) {
    return bad("port must be a number in 0..65535");
  }
  out.port = value;
  return out;
}

}  // namespace meridian
