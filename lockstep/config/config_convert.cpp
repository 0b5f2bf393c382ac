// Config::as<T>(): scalar text to C++ values, by YAML's core schema.
//
// The text decides, not the quoting: `lr: "0.1"` reads as 0.1 like `lr: 0.1`.
// Quoting matters only to to_yaml(), which must keep such a string a string.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "lockstep/config/config.h"
#include "lockstep/config/internal/config_node.h"

namespace lockstep {
namespace detail {
namespace {

enum class Parse { kOk, kNotThisType, kOutOfRange };

// Skips an optional leading sign; true when it is '-'.
bool take_sign(const std::string& text, size_t* pos) {
  if (text.empty() || (text[0] != '+' && text[0] != '-')) return false;
  *pos = 1;
  return text[0] == '-';
}

// Decimal, 0x hex and 0o octal integers with an optional sign (YAML 1.2 core).
Parse parse_int64(const std::string& text, int64_t* value) {
  size_t pos = 0;
  bool negative = take_sign(text, &pos);
  int base = 10;
  if (text.size() - pos > 2 && text[pos] == '0' && (text[pos + 1] == 'x' || text[pos + 1] == 'o')) {
    base = text[pos + 1] == 'x' ? 16 : 8;
    pos += 2;
  }
  if (pos == text.size()) return Parse::kNotThisType;
  const char* end = text.data() + text.size();
  uint64_t magnitude = 0;
  auto result = std::from_chars(text.data() + pos, end, magnitude, base);
  if (result.ptr != end) return Parse::kNotThisType;
  if (result.ec == std::errc::result_out_of_range) return Parse::kOutOfRange;
  if (result.ec != std::errc()) return Parse::kNotThisType;
  const uint64_t max_positive = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (!negative) {
    if (magnitude > max_positive) return Parse::kOutOfRange;
    *value = static_cast<int64_t>(magnitude);
  } else {
    if (magnitude > max_positive + 1) return Parse::kOutOfRange;
    *value = magnitude == max_positive + 1 ? std::numeric_limits<int64_t>::min()
                                           : -static_cast<int64_t>(magnitude);
  }
  return Parse::kOk;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// YAML 1.2 core floats: [-+]?(.digits|digits(.digits?)?)([eE][-+]?digits)?,
// .inf/.nan in three spellings, and the integers above.
Parse parse_double(const std::string& text, double* value) {
  size_t pos = 0;
  bool negative = take_sign(text, &pos);
  const std::string rest = text.substr(pos);
  if (rest == ".inf" || rest == ".Inf" || rest == ".INF") {
    *value = negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    return Parse::kOk;
  }
  if (pos == 0 && (rest == ".nan" || rest == ".NaN" || rest == ".NAN")) {
    *value = std::numeric_limits<double>::quiet_NaN();
    return Parse::kOk;
  }
  size_t i = pos;
  size_t digits = 0;
  while (i < text.size() && is_digit(text[i])) ++i, ++digits;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && is_digit(text[i])) ++i, ++digits;
  }
  bool grammar_ok = digits > 0;
  if (grammar_ok && i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    size_t exponent_digits = 0;
    while (i < text.size() && is_digit(text[i])) ++i, ++exponent_digits;
    grammar_ok = exponent_digits > 0;
  }
  if (!grammar_ok || i != text.size()) {
    int64_t integer = 0;
    Parse as_integer = parse_int64(text, &integer);
    if (as_integer == Parse::kOk) *value = static_cast<double>(integer);
    return as_integer;
  }
  // from_chars takes no '+'; the sign was checked above.
  const char* first = text.data() + (text[0] == '+' ? 1 : 0);
  const char* end = text.data() + text.size();
  auto result = std::from_chars(first, end, *value, std::chars_format::general);
  if (result.ec == std::errc::result_out_of_range) return Parse::kOutOfRange;
  if (result.ec != std::errc() || result.ptr != end) return Parse::kNotThisType;
  return Parse::kOk;
}

[[noreturn]] void fail_expected(const Config& config, const std::string& expected) {
  const ConfigNode& node = *ConfigNode::unwrap(config);
  if (node.missing) throw_missing(node);
  LOCKSTEP_FAIL(config.where(), ": expected ", expected, ", got ", describe_value(node));
}

const std::string& scalar_text(const Config& config, const std::string& expected) {
  const ConfigNode& node = *ConfigNode::unwrap(config);
  if (node.kind != Config::Kind::kScalar) fail_expected(config, expected);
  return node.text;
}

template <typename T, typename = void>
struct Converter;

template <>
struct Converter<bool> {
  static constexpr const char* kWhat = "a boolean (true/false)";
  static constexpr const char* kPlural = "booleans";
  static bool convert(const Config& config) {
    bool value = false;
    if (!parse_bool_text(scalar_text(config, kWhat), &value)) fail_expected(config, kWhat);
    return value;
  }
};

template <typename T>
struct Converter<T, std::enable_if_t<std::is_same_v<T, int> || std::is_same_v<T, int64_t>>> {
  static constexpr const char* kWhat = "an integer";
  static constexpr const char* kPlural = "integers";
  static T convert(const Config& config) {
    int64_t value = 0;
    Parse result = parse_int64(scalar_text(config, kWhat), &value);
    if (result == Parse::kOk && (value < std::numeric_limits<T>::min() || value > std::numeric_limits<T>::max())) {
      result = Parse::kOutOfRange;
    }
    if (result == Parse::kNotThisType) fail_expected(config, kWhat);
    if (result == Parse::kOutOfRange) {
      fail_expected(config, str_cat("an integer in [", std::numeric_limits<T>::min(), ", ",
                                    std::numeric_limits<T>::max(), "]"));
    }
    return static_cast<T>(value);
  }
};

template <typename T>
struct Converter<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static constexpr const char* kWhat = "a number";
  static constexpr const char* kPlural = "numbers";
  static T convert(const Config& config) {
    double value = 0;
    Parse result = parse_double(scalar_text(config, kWhat), &value);
    if (result == Parse::kOk && std::isfinite(value) &&
        std::fabs(value) > static_cast<double>(std::numeric_limits<T>::max())) {
      result = Parse::kOutOfRange;
    }
    if (result == Parse::kNotThisType) fail_expected(config, kWhat);
    if (result == Parse::kOutOfRange) {
      fail_expected(config, std::is_same_v<T, float> ? "a number in the range of a float"
                                                     : "a number in the range of a double");
    }
    return static_cast<T>(value);
  }
};

template <>
struct Converter<std::string> {
  static constexpr const char* kWhat = "a string";
  static constexpr const char* kPlural = "strings";
  static std::string convert(const Config& config) { return scalar_text(config, kWhat); }
};

template <typename T>
struct Converter<std::vector<T>> {
  static std::vector<T> convert(const Config& config) {
    if (!config.is_sequence()) fail_expected(config, str_cat("a sequence of ", Converter<T>::kPlural));
    std::vector<T> result;
    result.reserve(config.size());
    // Each element's own location and path ("betas.1") name the bad one.
    for (size_t i = 0; i < config.size(); ++i) result.push_back(config.at(i).as<T>());
    return result;
  }
};

}  // namespace

bool parse_bool_text(const std::string& text, bool* value) {
  static const char* const kTrue[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const char* const kFalse[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  for (const char* word : kTrue) {
    if (text == word) return *value = true, true;
  }
  for (const char* word : kFalse) {
    if (text == word) return *value = false, true;
  }
  return false;
}

bool is_null_text(const std::string& text) {
  return text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL";
}

bool looks_typed(const std::string& text) {
  bool flag = false;
  double number = 0;
  if (is_null_text(text) || parse_bool_text(text, &flag)) return true;
  if (parse_double(text, &number) != Parse::kNotThisType) return true;
  // YAML 1.1 readers also take y/n, 1_000, 1:30 and 0b101: keep those strings strings too.
  if (text == "y" || text == "Y" || text == "n" || text == "N") return true;
  size_t start = (text[0] == '+' || text[0] == '-' || text[0] == '.') ? 1 : 0;
  return start < text.size() && is_digit(text[start]);
}

}  // namespace detail

template <typename T>
T Config::as() const {
  node_->used = true;
  return detail::Converter<T>::convert(*this);
}

template bool Config::as<bool>() const;
template int Config::as<int>() const;
template int64_t Config::as<int64_t>() const;
template double Config::as<double>() const;
template float Config::as<float>() const;
template std::string Config::as<std::string>() const;
template std::vector<bool> Config::as<std::vector<bool>>() const;
template std::vector<int> Config::as<std::vector<int>>() const;
template std::vector<int64_t> Config::as<std::vector<int64_t>>() const;
template std::vector<double> Config::as<std::vector<double>>() const;
template std::vector<float> Config::as<std::vector<float>>() const;
template std::vector<std::string> Config::as<std::vector<std::string>>() const;

}  // namespace lockstep
