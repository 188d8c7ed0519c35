// Tests for levanter/viz/logprobs_html.hpp (model-free): the page's structure parsed loosely — one span per
// token, escaped text, titles, colours monotone in the log-prob, the diff page, the legend — the UTF-8 repair of
// byte tokens, and the atomic write. The program end to end is tests/viz_program.sh.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <levanter/viz/logprobs_html.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace viz = levanter::viz;
namespace fs = std::filesystem;

namespace {

// Every <span class="t ..."> element of the page: its attributes and inner text.
struct span_el {
  std::string cls, style, title, text;
  std::optional<double> lp, cmp, diff;
};

std::string attr(const std::string& tag, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const auto p = tag.find(key);
  if (p == std::string::npos) return {};
  const auto q = tag.find('"', p + key.size());
  return tag.substr(p + key.size(), q - p - key.size());
}

std::vector<span_el> token_spans(const std::string& html) {
  std::vector<span_el> out;
  std::size_t pos = 0;
  while ((pos = html.find("<span class=\"t", pos)) != std::string::npos) {
    const auto end_tag = html.find('>', pos);
    const auto close = html.find("</span>", end_tag);
    REQUIRE(end_tag != std::string::npos);
    REQUIRE(close != std::string::npos);
    const std::string tag = html.substr(pos, end_tag - pos);
    span_el s;
    s.cls = attr(tag, "class");
    s.style = attr(tag, "style");
    s.title = attr(tag, "title");
    s.text = html.substr(end_tag + 1, close - end_tag - 1);
    if (auto v = attr(tag, "data-lp"); !v.empty()) s.lp = std::stod(v);
    if (auto v = attr(tag, "data-cmp"); !v.empty()) s.cmp = std::stod(v);
    if (auto v = attr(tag, "data-diff"); !v.empty()) s.diff = std::stod(v);
    out.push_back(s);
    pos = close;
  }
  return out;
}

// hsla(h, s, l, a) -> {h, a}
std::pair<double, double> hue_alpha(const std::string& colour) {
  std::smatch m;
  static const std::regex re(R"(hsla\(([-0-9.]+),[0-9.]+%,[0-9.]+%,([0-9.]+)\))");
  REQUIRE_MESSAGE(std::regex_search(colour, m, re), colour);
  return {std::stod(m[1]), std::stod(m[2])};
}

std::string background(const std::string& style) {
  const auto p = style.find("background:");
  if (p == std::string::npos) return {};
  const auto e = style.find(';', p);
  return style.substr(p + 11, e == std::string::npos ? std::string::npos : e - p - 11);
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

viz::token_cell tok(std::string text, std::optional<double> lp, std::optional<double> cmp = std::nullopt) {
  viz::token_cell t;
  t.text = std::move(text);
  t.logprob = lp;
  t.comparison = cmp;
  return t;
}

viz::document sample_doc() {
  viz::document d;
  d.name = "doc <0>";
  d.tokens = {tok("Hello", std::nullopt), tok(" <b>&", -0.5), tok("\"quoted\" 'x'", -2.0), tok("\n", -3.25),
              tok("\tend", -12.0)};
  d.tokens[1].note = "top: 'x'";
  return d;
}

}  // namespace

TEST_CASE("escape_html and visible_text") {
  CHECK(viz::escape_html("a<b>&\"c'") == "a&lt;b&gt;&amp;&quot;c&#39;");
  CHECK(viz::visible_text("a\nb") == "a\xe2\x8f\x8e\nb");
  CHECK(viz::visible_text("a\nb", true) == "a\xe2\x8f\x8e" "b");
  CHECK(viz::visible_text("\t") == "\xe2\x87\xa5\t");
  CHECK(viz::visible_text(std::string("\r\x01\x7f", 3)) == "\xe2\x90\x8d\xe2\x90\x81\xe2\x90\xa1");
  CHECK(viz::visible_text(std::string(1, '\0')) == "\xe2\x90\x80");
  CHECK(viz::visible_text("plain é") == "plain é");
}

TEST_CASE("utf8_cells shows a split character on its first byte") {
  // "é" = C3 A9, "日" = E6 97 A5, one byte per token as the byte tokenizer gives them.
  const std::vector<std::string> raw = {"a", "\xc3", "\xa9", "\xe6", "\x97", "\xa5", "b", "\xff", "\xa9"};
  const auto cells = viz::utf8_cells(raw);
  REQUIRE(cells.size() == raw.size());
  CHECK(cells[0].text == "a");
  CHECK(cells[1].text == "é");
  CHECK(cells[2].text.empty());
  CHECK(cells[2].continuation);
  CHECK(cells[3].text == "日");
  CHECK(cells[4].continuation);
  CHECK(cells[5].continuation);
  CHECK(cells[6].text == "b");
  CHECK_FALSE(cells[6].continuation);
  CHECK(cells[7].text == "\\xFF");  // not UTF-8
  CHECK(cells[8].text == "\\xA9");  // a stray continuation byte
  CHECK_FALSE(cells[8].continuation);
  // Multi-byte tokens (a BPE) pass through; a truncated character at the end is shown as bytes.
  const auto bpe = viz::utf8_cells({"Gr\xc3\xbc\xc3", "\x9f" "e", "\xe2\x82"});
  CHECK(bpe[0].text == "Grüß");
  CHECK(bpe[1].text == "e");
  CHECK(bpe[2].text == "\\xE2\\x82");
}

TEST_CASE("the page has one escaped and titled span per token") {
  viz::html_options o;
  o.model_name = "ckpt/<run>/step-10";
  o.step = 10;
  const auto doc = sample_doc();
  const std::string html = viz::render_logprobs_html({doc, doc}, o);
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(html.find("</html>") != std::string::npos);
  // Self-contained: no external resource, no script needed.
  CHECK(html.find("src=") == std::string::npos);
  CHECK(html.find("href=\"http") == std::string::npos);
  CHECK(html.find("<link") == std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("<meta charset=\"utf-8\">") != std::string::npos);

  const auto spans = token_spans(html);
  REQUIRE(spans.size() == 2 * doc.tokens.size());
  CHECK(spans[0].text == "Hello");
  CHECK(spans[0].cls.find("na") != std::string::npos);  // the first token has no prediction
  CHECK_FALSE(spans[0].lp);
  CHECK(spans[0].style.empty());
  CHECK(spans[1].text == " &lt;b&gt;&amp;");
  CHECK(spans[2].text == "&quot;quoted&quot; &#39;x&#39;");
  CHECK(spans[3].text == "\xe2\x8f\x8e\n");     // a newline is shown and still breaks the line
  CHECK(spans[4].text == "\xe2\x87\xa5\tend");
  // No raw markup from token text anywhere in the page.
  CHECK(html.find("<b>&") == std::string::npos);
  CHECK(html.find("\"quoted\"") == std::string::npos);

  // Titles: the token (escaped, on one line), its log-prob and probability, and the note.
  CHECK(spans[1].title == "&#39; &lt;b&gt;&amp;&#39;  logprob -0.500  p 0.6065  top: &#39;x&#39;");
  CHECK(spans[3].title.find("\n") == std::string::npos);
  CHECK(spans[3].title.find("logprob -3.250") != std::string::npos);
  for (std::size_t i = 1; i < doc.tokens.size(); ++i) {
    REQUIRE(spans[i].lp);
    CHECK(*spans[i].lp == doctest::Approx(*doc.tokens[i].logprob).epsilon(1e-4));
    CHECK(background(spans[i].style).rfind("hsla(", 0) == 0);
  }

  // Header: model, step, and per-document mean log-prob and perplexity.
  CHECK(html.find("ckpt/&lt;run&gt;/step-10") != std::string::npos);
  CHECK(html.find("step <b>10</b>") != std::string::npos);
  const double mean = (-0.5 - 2.0 - 3.25 - 12.0) / 4.0;
  char buf[64];
  std::snprintf(buf, sizeof buf, "mean log-prob %.4f, perplexity %.3f", mean, std::exp(-mean));
  CHECK(count(html, buf) >= 2);  // each document's heading (and the overall line: both docs are the same)
  CHECK(count(html, "<div class=\"doc\"") == 2);
  CHECK(html.find("doc &lt;0&gt;") != std::string::npos);
  const auto st = viz::stats_of(doc);
  CHECK(st.scored == 4);
  CHECK(st.mean_logprob == doctest::Approx(mean));
  CHECK(st.perplexity == doctest::Approx(std::exp(-mean)));

  // Legend: swatches from 0 down to the clamp.
  CHECK(html.find("class=\"legend\"") != std::string::npos);
  CHECK(count(html, "class=\"sw\"") >= 5);
  CHECK(html.find("-10.0 (p") != std::string::npos);
}

TEST_CASE("colours are monotone in the log-prob and clamp at min_logprob") {
  double last_hue = 1e9, last_alpha = -1;
  for (double lp = 0.0; lp >= -12.0; lp -= 0.25) {
    const auto [h, a] = hue_alpha(viz::logprob_colour(lp));
    CHECK(h <= last_hue);   // red for unlikely, yellow for likely
    CHECK(a >= last_alpha); // more opaque the more surprising
    last_hue = h;
    last_alpha = a;
  }
  CHECK(hue_alpha(viz::logprob_colour(0.0)).first == doctest::Approx(60));
  CHECK(hue_alpha(viz::logprob_colour(0.0)).second == doctest::Approx(0));
  CHECK(hue_alpha(viz::logprob_colour(-10.0)).first == doctest::Approx(0));
  CHECK(viz::logprob_colour(-10.0) == viz::logprob_colour(-50.0));
  CHECK(hue_alpha(viz::logprob_colour(-1.0)).second < hue_alpha(viz::logprob_colour(-2.0)).second);
  // In a page the spans carry the same colours, in order of their log-probs.
  viz::document d;
  d.tokens.push_back(tok("x", std::nullopt));
  for (double lp : {-0.1, -7.0, -1.0, -3.0, -0.01}) d.tokens.push_back(tok("y", lp));
  auto spans = token_spans(viz::render_logprobs_html({d}, {}));
  spans.erase(spans.begin());
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) { return *a.lp < *b.lp; });
  for (std::size_t i = 1; i < spans.size(); ++i) {
    const auto [h0, a0] = hue_alpha(background(spans[i - 1].style));
    const auto [h1, a1] = hue_alpha(background(spans[i].style));
    CHECK(h0 <= h1);
    CHECK(a0 > a1);
  }
}

TEST_CASE("the diff page colours model minus comparison blue above and red below") {
  CHECK(viz::diff_colour(0.0) == "transparent");
  const auto [hp, ap] = hue_alpha(viz::diff_colour(1.0));
  const auto [hn, an] = hue_alpha(viz::diff_colour(-1.0));
  CHECK(hp == doctest::Approx(219));
  CHECK(hn == doctest::Approx(0));
  CHECK(ap == doctest::Approx(an));
  CHECK(hue_alpha(viz::diff_colour(2.0)).second > ap);
  CHECK(viz::diff_colour(5.0) == viz::diff_colour(9.0));

  viz::document d;
  d.tokens = {tok("a", std::nullopt), tok("b", -1.0, -3.0), tok("c", -4.0, -1.0), tok("d", -2.0, -2.0)};
  viz::html_options o;
  o.diff = true;
  o.model_name = "new";
  o.comparison_name = "old";
  const std::string html = viz::render_logprobs_html({d}, o);
  const auto spans = token_spans(html);
  REQUIRE(spans.size() == 4);
  REQUIRE(spans[1].diff);
  CHECK(*spans[1].diff == doctest::Approx(2.0));
  CHECK(*spans[2].diff == doctest::Approx(-3.0));
  CHECK(*spans[1].cmp == doctest::Approx(-3.0));
  CHECK(hue_alpha(background(spans[1].style)).first == doctest::Approx(219));
  CHECK(hue_alpha(background(spans[2].style)).first == doctest::Approx(0));
  CHECK(background(spans[3].style) == "transparent");
  // Borders: the model's and the comparison's own log-probs on the absolute scale.
  CHECK(spans[1].style.find("border-top-color:" + viz::logprob_colour(-1.0)) != std::string::npos);
  CHECK(spans[1].style.find("border-bottom-color:" + viz::logprob_colour(-3.0)) != std::string::npos);
  CHECK(spans[1].title.find("diff +2.000  model -1.000  comparison -3.000") != std::string::npos);
  CHECK(html.find("comparison: <b>old</b>") != std::string::npos);
  CHECK(html.find("comparison mean log-prob") != std::string::npos);
  CHECK(html.find("blue: the model assigns") != std::string::npos);
  // A scored token without a comparison value cannot go on a diff page.
  d.tokens.push_back(tok("e", -1.0));
  CHECK_THROWS_AS(viz::render_logprobs_html({d}, o), viz::viz_error);
}

TEST_CASE("continuation and special tokens") {
  viz::document d;
  d.tokens = {tok("a", std::nullopt), tok("\xc3\xa9", -1.0), tok("", -0.5), tok("<|endoftext|>", -0.2), tok("b", -3.0)};
  d.tokens[2].continuation = true;
  d.tokens[3].special = true;
  const auto html = viz::render_logprobs_html({d}, {});
  const auto spans = token_spans(html);
  REQUIRE(spans.size() == 5);
  CHECK(spans[2].cls.find("cont") != std::string::npos);
  CHECK(spans[2].text.empty());
  CHECK(spans[2].title.find("continuation") != std::string::npos);
  CHECK(spans[3].cls.find("sp") != std::string::npos);
  CHECK(spans[3].text == "&lt;|endoftext|&gt;");
  CHECK(html.find("&lt;|endoftext|&gt;</span>\n<span") != std::string::npos);  // a line break follows EOS
}

TEST_CASE("write_logprobs_html writes atomically and replaces the old page") {
  const fs::path dir = fs::temp_directory_path() / ("levanter_viz_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const fs::path page = dir / "sub" / "logprobs.html";
  viz::html_options o;
  o.step = 1;
  viz::write_logprobs_html(page, {sample_doc()}, o);  // creates the directory
  REQUIRE(fs::exists(page));
  auto read = [&] {
    std::ifstream in(page);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  CHECK(read().find("step <b>1</b>") != std::string::npos);
  // Someone holds the old page open while it is rewritten: they keep reading the old one (a new inode).
  std::ifstream held(page);
  o.step = 2;
  viz::write_logprobs_html(page, {sample_doc()}, o);
  std::stringstream old;
  old << held.rdbuf();
  CHECK(old.str().find("step <b>1</b>") != std::string::npos);
  CHECK(read().find("step <b>2</b>") != std::string::npos);
  CHECK(read() == viz::render_logprobs_html({sample_doc()}, o));
  // No temporary file is left behind.
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(page.parent_path())) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 1);
  // An unwritable place is an error naming the file.
  std::ofstream(dir / "blocker") << "x";
  try {
    viz::write_logprobs_html(dir / "blocker" / "p.html", {sample_doc()}, o);
    FAIL("expected viz_error");
  } catch (const viz::viz_error& e) {
    CHECK(std::string(e.what()).find("blocker") != std::string::npos);
  }
  fs::remove_all(dir);
}
