// levanter/viz/logprobs_html.hpp: the token-probability heatmap (upstream `levanter.analysis.visualization`:
// visualize_log_probs and visualize_log_prob_diff) as one self-contained HTML page: every token of every document
// is a <span> coloured by its log-probability under the model, or by the difference against a comparison model,
// with the token and its value in the span's `title` (shown on hover). Inline CSS, no script, no external resource.
//
//   levanter::viz::document d{"doc 0", {{"Hello", std::nullopt}, {" world", -1.25}}};
//   levanter::viz::html_options o;  o.model_name = "checkpoints/run/step-300";  o.step = 300;
//   levanter::viz::write_logprobs_html("logprobs.html", {d}, o);  // atomic: readers never see half a page
//
// Colours follow upstream: on the absolute scale the log-prob is clamped to [min_logprob, 0] and mapped to a hue
// from red (0°, unlikely) to yellow (60°, likely), with opacity 1 − exp(lp / 5), so a well-predicted token is
// nearly transparent. On the diff scale (model − comparison, clamped to ±diff_threshold) the model being better
// is blue, worse is red, opacity 1 − exp(−|diff| / 3); each token's top border shows the model's own log-prob and
// its bottom border the comparison's, on the absolute scale. Light header: no model include.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace levanter::viz {

/// A page that cannot be written (the message names the file and what to do), or documents that do not fit the
/// page asked for.
struct viz_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One token of a document as the page shows it.
struct token_cell {
  std::string text;                  ///< display text, UTF-8 (escaped and made visible when written)
  std::optional<double> logprob;     ///< log p(token | tokens before it); none for a document's first token
  std::optional<double> comparison;  ///< the same under the comparison model (diff pages)
  std::string note;                  ///< appended to the hover text (e.g. the model's top prediction)
  bool continuation = false;         ///< a later piece of a character shown on an earlier token
  bool special = false;              ///< a special token (EOS): set apart, and a line break follows it
};

/// A document: a name for its heading and its tokens in order.
struct document {
  std::string name;
  std::vector<token_cell> tokens;
};

/// What the page says besides the tokens.
struct html_options {
  std::string title = "Token log-probabilities";
  std::string model_name;            ///< the model or checkpoint shown in the header
  std::optional<std::int64_t> step;  ///< the training step of the model
  std::string comparison_name;       ///< the comparison model (diff pages)
  bool diff = false;                 ///< colour by logprob − comparison instead of logprob
  double min_logprob = -10.0;        ///< lower clamp of the absolute scale (upstream: −10)
  double diff_threshold = 5.0;       ///< clamp of the diff scale (upstream: 5)
};

/// Mean log-prob and perplexity of the tokens of a document that have a value.
struct doc_stats {
  std::int64_t scored = 0;
  double mean_logprob = 0;
  double perplexity = 0;
  std::optional<double> mean_comparison;
};

// ---- text -------------------------------------------------------------------------------------------------------

/// `s` with &, <, >, " and ' replaced by entities (safe in element text and in quoted attributes).
std::string escape_html(std::string_view s);

/// `s` with whitespace and control characters made visible (upstream `_escape`): a newline becomes ⏎ and, unless
/// `single_line`, still breaks the line; a tab becomes ⇥ (then the tab); other control characters become their
/// Unicode control pictures (␍, ␀, …, ␡). The result is not HTML-escaped.
std::string visible_text(std::string_view s, bool single_line = false);

/// Display texts for tokens given as raw bytes (a byte-level tokenizer splits characters across tokens): each
/// UTF-8 character is shown whole on the token where it starts, and a token holding only later bytes of a
/// character gets an empty text with `continuation` set. Bytes that are not valid UTF-8 show as `\xNN`.
/// Returns one cell per token (text and continuation only).
std::vector<token_cell> utf8_cells(const std::vector<std::string>& raw);

// ---- colours ----------------------------------------------------------------------------------------------------

/// The absolute-scale colour of a log-prob as CSS `hsla(h, 100%, 50%, a)` (see the top of this file).
std::string logprob_colour(double lp, double min_logprob = -10.0);

/// The diff-scale colour of `diff` = model − comparison: blue when the model assigns more probability, red when
/// less, transparent at 0.
std::string diff_colour(double diff, double threshold = 5.0);

// ---- the page ---------------------------------------------------------------------------------------------------

/// Statistics of one document (tokens without a log-prob are not counted).
doc_stats stats_of(const document& d);

/// The page as a string (see write_logprobs_html). Throws viz_error when `o.diff` is set and a token with a
/// log-prob has no comparison value.
std::string render_logprobs_html(const std::vector<document>& docs, const html_options& o);

/// Writes the heatmap page of `docs` to `path` (atomically: a browser refreshing it sees the old page or the new one):
/// one <span> per token with its colour, `data-lp` (and `data-cmp`, `data-diff` on diff pages) and a `title` with the
/// token and its values; a header with the model, step and per-document mean log-prob and perplexity; and a legend.
void write_logprobs_html(const std::filesystem::path& path, const std::vector<document>& docs, const html_options& o);

}  // namespace levanter::viz
