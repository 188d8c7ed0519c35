// viz/logprobs_html.hpp: the token-probability heatmap page.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <levanter/io/atomic_file.hpp>
#include <levanter/viz/logprobs_html.hpp>

namespace levanter::viz {

std::string escape_html(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string visible_text(std::string_view s, bool single_line) {
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += single_line ? "\xe2\x8f\x8e" : "\xe2\x8f\x8e\n";
    } else if (c == '\t') {
      out += single_line ? "\xe2\x87\xa5" : "\xe2\x87\xa5\t";
    } else if (c < 0x20) {  // U+2400 + c
      out += "\xe2\x90";
      out.push_back(static_cast<char>(0x80 + c));
    } else if (c == 0x7f) {
      out += "\xe2\x90\xa1";
    } else {
      out.push_back(ch);
    }
  }
  return out;
}

namespace detail {
namespace {
// Length of the UTF-8 sequence that starts with `b` (0: not a valid lead byte).
int utf8_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xc2 && b <= 0xdf) return 2;
  if (b >= 0xe0 && b <= 0xef) return 3;
  if (b >= 0xf0 && b <= 0xf4) return 4;
  return 0;
}
std::string hex_byte(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02X", b);
  return buf;
}
}  // namespace
}  // namespace detail

std::vector<token_cell> utf8_cells(const std::vector<std::string>& raw) {
  std::vector<token_cell> cells(raw.size());
  // The bytes of all tokens with the token each byte came from.
  std::string bytes;
  std::vector<std::size_t> owner;
  for (std::size_t t = 0; t < raw.size(); ++t) {
    bytes += raw[t];
    owner.insert(owner.end(), raw[t].size(), t);
  }
  std::vector<bool> got_start(raw.size(), false);
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    const int n = detail::utf8_length(b);
    bool ok = n > 0 && i + static_cast<std::size_t>(n) <= bytes.size();
    for (int k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(bytes[i + k]) & 0xc0) == 0x80;
    if (ok && n >= 3) {  // overlong, surrogate and out-of-range forms
      const auto b1 = static_cast<unsigned char>(bytes[i + 1]);
      if ((b == 0xe0 && b1 < 0xa0) || (b == 0xed && b1 >= 0xa0) || (b == 0xf0 && b1 < 0x90) ||
          (b == 0xf4 && b1 >= 0x90))
        ok = false;
    }
    const std::size_t t = owner[i];
    got_start[t] = true;
    if (!ok) {
      cells[t].text += detail::hex_byte(b);
      ++i;
      continue;
    }
    cells[t].text.append(bytes, i, static_cast<std::size_t>(n));
    i += static_cast<std::size_t>(n);
  }
  for (std::size_t t = 0; t < raw.size(); ++t) cells[t].continuation = !raw[t].empty() && !got_start[t];
  return cells;
}

std::string logprob_colour(double lp, double min_logprob) {
  lp = std::min(lp, 0.0);
  const double clamped = std::max(lp, min_logprob);
  const double norm = min_logprob < 0 ? (clamped - min_logprob) / -min_logprob : 1.0;
  const double hue = 60.0 * norm;
  const double alpha = 1.0 - std::exp(clamped / 5.0);
  char buf[64];
  std::snprintf(buf, sizeof buf, "hsla(%.1f,100%%,50%%,%.3f)", hue, alpha);
  return buf;
}

std::string diff_colour(double diff, double threshold) {
  diff = std::clamp(diff, -threshold, threshold);
  if (diff == 0.0) return "transparent";
  const double alpha = 1.0 - std::exp(-std::abs(diff) / 3.0);
  char buf[64];
  if (diff > 0)
    std::snprintf(buf, sizeof buf, "hsla(219,70%%,50%%,%.3f)", alpha);
  else
    std::snprintf(buf, sizeof buf, "hsla(0,85%%,50%%,%.3f)", alpha);
  return buf;
}

doc_stats stats_of(const document& d) {
  doc_stats s;
  double sum = 0, csum = 0;
  std::int64_t cn = 0;
  for (const auto& t : d.tokens) {
    if (!t.logprob) continue;
    ++s.scored;
    sum += *t.logprob;
    if (t.comparison) csum += *t.comparison, ++cn;
  }
  if (s.scored > 0) {
    s.mean_logprob = sum / double(s.scored);
    s.perplexity = std::exp(-s.mean_logprob);
  }
  if (cn > 0) s.mean_comparison = csum / double(cn);
  return s;
}

namespace detail {
namespace {
std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string token_span(const token_cell& t, const html_options& o) {
  const std::string shown =
      t.continuation ? std::string("(continuation of the character before)") : "'" + visible_text(t.text, true) + "'";
  std::string title = shown, style, cls = "t", data;
  if (t.logprob) {
    const double lp = *t.logprob;
    data = " data-lp=\"" + fmt("%.4f", lp) + "\"";
    if (o.diff) {
      const double c = *t.comparison;
      const double d = lp - c;
      data += " data-cmp=\"" + fmt("%.4f", c) + "\" data-diff=\"" + fmt("%.4f", d) + "\"";
      style = "background:" + diff_colour(d, o.diff_threshold) +
              ";border-top-color:" + logprob_colour(lp, o.min_logprob) +
              ";border-bottom-color:" + logprob_colour(c, o.min_logprob);
      title += "  diff " + fmt("%+.3f", d) + "  model " + fmt("%.3f", lp) + "  comparison " + fmt("%.3f", c);
    } else {
      style = "background:" + logprob_colour(lp, o.min_logprob);
      title += "  logprob " + fmt("%.3f", lp) + "  p " + fmt("%.4f", std::exp(lp));
      if (t.comparison) title += "  comparison " + fmt("%.3f", *t.comparison);
    }
  } else {
    cls += " na";
    title += "  (no prediction: the first token)";
  }
  if (!t.note.empty()) title += "  " + t.note;
  if (t.continuation) cls += " cont";
  if (t.special) cls += " sp";
  std::string out = "<span class=\"" + cls + "\"" + (style.empty() ? "" : " style=\"" + style + "\"") + data +
                    " title=\"" + escape_html(title) + "\">" + escape_html(visible_text(t.text)) + "</span>";
  if (t.special) out += "\n";
  return out;
}

std::string legend(const html_options& o) {
  std::string out = "<div class=\"legend\"><b>Legend</b> ";
  if (o.diff) {
    out +=
        "(background: model &minus; comparison log-prob; top border: the model&#39;s log-prob, bottom border: "
        "the comparison&#39;s, on the absolute scale)<br>";
    const double t = o.diff_threshold;
    for (double d : {-t, -0.6 * t, -0.2 * t, -0.05 * t, 0.0, 0.05 * t, 0.2 * t, 0.6 * t, t})
      out += "<span class=\"sw\" style=\"background:" + diff_colour(d, t) + "\">" + fmt("%+.2f", d) + "</span>";
    out += " <span class=\"hint\">blue: the model assigns the token more probability; red: less</span>";
  } else {
    out += "(background: log-probability of the token given the ones before it; hover for values)<br>";
    const double m = o.min_logprob;
    for (double lp : {0.0, 0.05 * m, 0.1 * m, 0.2 * m, 0.3 * m, 0.5 * m, 0.75 * m, m})
      out += "<span class=\"sw\" style=\"background:" + logprob_colour(lp, m) + "\">" + fmt("%.1f", lp) + " (p " +
             fmt("%.3g", std::exp(lp)) + ")</span>";
    out += " <span class=\"hint\">transparent: well predicted; red: surprising</span>";
  }
  return out + "</div>\n";
}
}  // namespace
}  // namespace detail

std::string render_logprobs_html(const std::vector<document>& docs, const html_options& o) {
  using detail::fmt;
  if (o.diff)
    for (std::size_t i = 0; i < docs.size(); ++i)
      for (const auto& t : docs[i].tokens)
        if (t.logprob && !t.comparison)
          throw viz_error(
              "render_logprobs_html: a diff page needs a comparison log-prob for every scored token "
              "(document " +
              std::to_string(i) + " lacks one)");
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>" + escape_html(o.title) +
       "</title>\n<style>\n"
       "body{font-family:sans-serif;margin:1.5em;color:#222;background:#fff}\n"
       "h1{font-size:1.4em;margin:0 0 .3em}\n"
       ".meta{color:#555;margin:.2em 0}\n"
       "table.summary{border-collapse:collapse;margin:.6em 0;font-size:.9em}\n"
       "table.summary td,table.summary th{border:1px solid #ccc;padding:.15em .6em;text-align:right}\n"
       ".legend{margin:.8em 0;font-size:.9em}\n"
       ".legend .sw{display:inline-block;font-family:monospace;padding:.2em .4em;margin:.2em .15em;border:1px solid "
       "#ddd}\n"
       ".hint{color:#666}\n"
       ".doc{margin:1.2em 0;border-top:1px solid #ddd;padding-top:.4em}\n"
       ".doc h2{font-size:1em;margin:.2em 0 .5em;font-weight:normal;color:#333}\n"
       ".lp{font-family:monospace;white-space:pre-wrap;word-break:break-all;line-height:2.1;tab-size:4}\n"
       ".lp .t{padding:.15em 0;border-radius:2px}\n"
       ".lp .cont{padding:.15em .12em}\n"
       ".lp .na{outline:1px dotted #999}\n"
       ".lp .sp{color:#777;font-style:italic;border:1px solid #bbb}\n";
  if (o.diff) h += ".lp .t{border-top:3px solid transparent;border-bottom:3px solid transparent}\n";
  h += "</style></head><body>\n<h1>" + escape_html(o.title) + "</h1>\n<div class=\"meta\">model: <b>" +
       escape_html(o.model_name.empty() ? std::string("(unnamed)") : o.model_name) + "</b>";
  if (o.step) h += ", step <b>" + std::to_string(*o.step) + "</b>";
  if (o.diff)
    h += "; comparison: <b>" + escape_html(o.comparison_name.empty() ? std::string("(unnamed)") : o.comparison_name) +
         "</b>";
  h += "</div>\n";

  // Summary: per document and over all scored tokens.
  double total = 0, ctotal = 0;
  std::int64_t n = 0;
  std::vector<doc_stats> st;
  for (const auto& d : docs) {
    st.push_back(stats_of(d));
    total += st.back().mean_logprob * double(st.back().scored);
    if (st.back().mean_comparison) ctotal += *st.back().mean_comparison * double(st.back().scored);
    n += st.back().scored;
  }
  h += "<div class=\"meta\">" + std::to_string(docs.size()) + (docs.size() == 1 ? " document, " : " documents, ") +
       std::to_string(n) + " scored tokens";
  if (n > 0) {
    h += ", mean log-prob " + fmt("%.4f", total / double(n)) + ", perplexity " +
         fmt("%.3f", std::exp(-total / double(n)));
    if (o.diff)
      h += "; comparison mean log-prob " + fmt("%.4f", ctotal / double(n)) + ", perplexity " +
           fmt("%.3f", std::exp(-ctotal / double(n)));
  }
  h += "</div>\n<table class=\"summary\"><tr><th>document</th><th>tokens</th><th>mean log-prob</th><th>perplexity</th>";
  if (o.diff) h += "<th>comparison mean</th><th>comparison perplexity</th>";
  h += "</tr>\n";
  for (std::size_t i = 0; i < docs.size(); ++i) {
    h += "<tr><td><a href=\"#doc-" + std::to_string(i) + "\">" + escape_html(docs[i].name) + "</a></td><td>" +
         std::to_string(docs[i].tokens.size()) + "</td><td>" + (st[i].scored ? fmt("%.4f", st[i].mean_logprob) : "") +
         "</td><td>" + (st[i].scored ? fmt("%.3f", st[i].perplexity) : "") + "</td>";
    if (o.diff)
      h += "<td>" + (st[i].mean_comparison ? fmt("%.4f", *st[i].mean_comparison) : "") + "</td><td>" +
           (st[i].mean_comparison ? fmt("%.3f", std::exp(-*st[i].mean_comparison)) : "") + "</td>";
    h += "</tr>\n";
  }
  h += "</table>\n" + detail::legend(o);

  for (std::size_t i = 0; i < docs.size(); ++i) {
    h += "<div class=\"doc\" id=\"doc-" + std::to_string(i) + "\"><h2>" + escape_html(docs[i].name) + " &mdash; " +
         std::to_string(docs[i].tokens.size()) + " tokens";
    if (st[i].scored)
      h += ", mean log-prob " + fmt("%.4f", st[i].mean_logprob) + ", perplexity " + fmt("%.3f", st[i].perplexity);
    if (o.diff && st[i].mean_comparison) h += " (comparison " + fmt("%.4f", *st[i].mean_comparison) + ")";
    h += "</h2><div class=\"lp\">";
    for (const auto& t : docs[i].tokens) h += detail::token_span(t, o);
    h += "</div></div>\n";
  }
  h += "</body></html>\n";
  return h;
}

void write_logprobs_html(const std::filesystem::path& path, const std::vector<document>& docs, const html_options& o) {
  try {
    io::write_file_atomic(path, render_logprobs_html(docs, o), {.create_parent = true});
  } catch (const io::io_error& e) {
    throw viz_error(e.what());
  }
}

}  // namespace levanter::viz
