// levanter/lora.hpp: target matching, initialisation and the PEFT files.
#include <levanter/lora.hpp>

#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include <haliax/autodiff.hpp>
#include <haliax/nn/dropout.hpp>
#include <haliax/ops/layout.hpp>
#include <levanter/compat/safetensors.hpp>
#include <levanter/io/atomic_file.hpp>

namespace levanter {

void validate(config::validator& v, const LoraConfig& c, const std::string& prefix) {
  config::check_int(v, prefix + ".r", c.r, 1, 1 << 16, "the adapters' rank");
  if (!std::isfinite(c.alpha) || c.alpha <= 0)
    v.error(prefix + ".alpha", "must be a positive number (the adapters add alpha / r * B.A), got " +
                                   std::to_string(c.alpha));
  if (!std::isfinite(c.dropout) || c.dropout < 0 || c.dropout >= 1)
    v.error(prefix + ".dropout", "must be in [0, 1), got " + std::to_string(c.dropout));
  if (c.target_modules) {
    if (const auto* re = std::get_if<std::string>(&*c.target_modules)) {
      try {
        std::regex check(*re, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        v.error(prefix + ".target_modules", "'" + *re + "' is not a valid regular expression (" + e.what() + ")");
      }
    } else if (std::get<std::vector<std::string>>(*c.target_modules).empty()) {
      v.error(prefix + ".target_modules", "an empty list adapts nothing: list module names, or leave it unset for "
                                          "every Linear");
    }
  }
}

namespace lora {

bool matches_target(const LoraConfig& c, const std::string& module) {
  if (!c.target_modules) return true;
  if (const auto* re = std::get_if<std::string>(&*c.target_modules)) {
    // Python's re.match: anchored at the start, not at the end
    return std::regex_search(module, std::regex(*re, std::regex::ECMAScript), std::regex_constants::match_continuous);
  }
  for (const auto& t : std::get<std::vector<std::string>>(*c.target_modules))
    if (module.size() >= t.size() && module.compare(module.size() - t.size(), t.size(), t) == 0) return true;
  return false;
}

params init(const spec& s, hax::random::key key) {
  params p;
  for (std::size_t t = 0; t < s.targets.size(); ++t) {
    const target& tg = s.targets[t];
    const auto k = hax::random::fold_in(key, static_cast<std::uint32_t>(t));
    adapter a;
    a.lora_A = hax::multiply(hax::random::truncated_normal(k, tg.layers * LoraLayers, s.r * R, tg.in * LoraIn, -3.0f, 3.0f),
                             static_cast<float>(1.0 / std::sqrt(static_cast<double>(tg.in))));
    a.lora_B = hax::zeros<float>(tg.layers * LoraLayers, tg.out * LoraOut, s.r * R);
    p.adapters.push_back(std::move(a));
  }
  return p;
}

hax::random::key dropout_key(hax::random::key k, std::size_t target, std::int64_t layer) {
  // a stream of its own: the models' own dropout folds small indices into the same key
  const auto lora = hax::random::fold_in(k, 0x6c6f7261u);  // "lora"
  return hax::random::fold_in(hax::random::fold_in(lora, static_cast<std::uint32_t>(target)),
                              static_cast<std::uint32_t>(layer));
}

namespace {

class adapter_dropout final : public hax::nn::linear_side {
 public:
  adapter_dropout(std::vector<weight_range> ranges, params p, spec s, double dropout, hax::random::key key,
                  std::shared_ptr<std::vector<std::int64_t>> applied)
      : ranges_(std::move(ranges)), p_(std::move(p)), s_(std::move(s)), dropout_(dropout), key_(key),
        applied_(std::move(applied)) {
    if (ranges_.size() != s_.targets.size() || p_.adapters.size() != s_.targets.size())
      throw std::invalid_argument("lora::dropout_side: weights, adapters and targets differ in number");
    for (const auto& a : p_.adapters) {  // per layer views (one gradient node per array, however many are used)
      a_.push_back(hax::unbind(a.lora_A, LoraLayers));
      b_.push_back(hax::unbind(a.lora_B, LoraLayers));
    }
  }

  std::optional<hax::named_array<float, hax::axes<hax::nn::SideRows, hax::nn::SideOut>>> apply(
      const float* weight, const hax::named_array<float, hax::axes<hax::nn::SideRows, hax::nn::SideIn>>& x)
      const override {
    for (std::size_t t = 0; t < ranges_.size(); ++t) {
      const weight_range& r = ranges_[t];
      // addresses as integers: `weight` may point into another array
      const auto at = reinterpret_cast<std::uintptr_t>(weight), begin = reinterpret_cast<std::uintptr_t>(r.data);
      const auto bytes = static_cast<std::uintptr_t>(r.per_layer) * sizeof(float);
      if (at < begin || at >= begin + bytes * static_cast<std::uintptr_t>(r.layers) || (at - begin) % bytes != 0)
        continue;
      const auto layer = static_cast<std::int64_t>((at - begin) / bytes);
      const target& tg = s_.targets[t];
      if (x.sizes()[1] != tg.in)
        throw hax::shape_error("lora: the Linear '" + tg.module + "' was applied to " + x.shape_string() + " where its "
                               "adapter takes " + std::to_string(tg.in) + " inputs");
      if (applied_) ++(*applied_)[t];
      const std::int64_t rows = x.sizes()[0];
      auto xl = hax::detail::layout::reinterpret<hax::axes<hax::nn::SideRows, LoraIn>>(x, {rows, tg.in});
      // W' x with W' = W + scale B.A is already the Linear's output: add scale B.A (dropout(x) - x)
      auto delta = hax::subtract(hax::nn::Dropout{dropout_}(xl, dropout_key(key_, t, layer)), xl);
      const auto ul = static_cast<std::size_t>(layer);
      auto h = hax::dot<hax::axes<hax::nn::SideRows, R>>(delta, a_[t][ul], LoraIn);
      auto z = hax::multiply(hax::dot<hax::axes<hax::nn::SideRows, LoraOut>>(h, b_[t][ul], R),
                             static_cast<float>(s_.scale));
      return hax::detail::layout::reinterpret<hax::axes<hax::nn::SideRows, hax::nn::SideOut>>(z, {rows, tg.out});
    }
    return std::nullopt;
  }

  std::shared_ptr<const hax::ambient> rebound(std::uint64_t outer,
                                              std::vector<std::function<void()>>& transfers) const override {
    params p = p_;
    hax::detail::ad::rebind_leaves(p, outer, transfers);
    return std::make_shared<adapter_dropout>(ranges_, std::move(p), s_, dropout_, key_, applied_);
  }

 private:
  std::vector<weight_range> ranges_;
  params p_;
  spec s_;
  double dropout_;
  hax::random::key key_;
  std::shared_ptr<std::vector<std::int64_t>> applied_;
  std::vector<std::vector<hax::named_array<float, hax::axes<R, LoraIn>>>> a_;
  std::vector<std::vector<hax::named_array<float, hax::axes<LoraOut, R>>>> b_;
};

}  // namespace

std::shared_ptr<const hax::nn::linear_side> dropout_side(std::vector<weight_range> ranges, const params& p,
                                                         const spec& s, double dropout, hax::random::key key,
                                                         std::shared_ptr<std::vector<std::int64_t>> applied) {
  if (!std::isfinite(dropout) || dropout <= 0 || dropout >= 1)
    throw std::invalid_argument("lora::dropout_side: dropout must be in (0, 1), got " + std::to_string(dropout));
  if (applied) applied->assign(s.targets.size(), 0);
  return std::make_shared<adapter_dropout>(std::move(ranges), p, s, dropout, key, std::move(applied));
}

std::int64_t parameter_count(const spec& s) {
  std::int64_t n = 0;
  for (const auto& t : s.targets) n += t.layers * s.r * (t.in + t.out);
  return n;
}

namespace {

// "model.layers.{i}.self_attn.q_proj" -> "self_attn.q_proj" (PEFT matches a listed name against the end of the
// module's path); a module outside the layers keeps its whole name.
std::string peft_target_name(const std::string& pattern) {
  const auto at = pattern.find("{i}.");
  return at == std::string::npos ? pattern : pattern.substr(at + 4);
}

std::string layer_name(const std::string& pattern, std::int64_t i) {
  const auto at = pattern.find("{i}");
  return at == std::string::npos ? pattern : pattern.substr(0, at) + std::to_string(i) + pattern.substr(at + 3);
}

}  // namespace

std::string peft_config_json(const spec& s, const LoraConfig& c, const std::string& base_model,
                             const std::vector<std::string>& hf_modules) {
  std::set<std::string> names;
  for (const auto& m : hf_modules) names.insert(peft_target_name(m));
  bool conv1d = false;
  for (const auto& t : s.targets) conv1d = conv1d || !t.out_first;
  nlohmann::json j = {{"base_model_name_or_path", base_model},
                      {"bias", "none"},
                      {"fan_in_fan_out", conv1d},
                      {"inference_mode", true},
                      {"init_lora_weights", true},
                      {"lora_alpha", c.alpha},
                      {"lora_dropout", c.dropout},
                      {"modules_to_save", nullptr},
                      {"peft_type", "LORA"},
                      {"r", s.r},
                      {"target_modules", std::vector<std::string>(names.begin(), names.end())},
                      {"task_type", "CAUSAL_LM"}};
  return j.dump(2) + "\n";
}

void write_peft(const params& p, const spec& s, const LoraConfig& c, const std::string& base_model,
                const std::vector<std::string>& hf_module_patterns, const std::string& dir) {
  if (hf_module_patterns.size() != s.targets.size() || p.adapters.size() != s.targets.size())
    throw std::invalid_argument("lora::write_peft: adapters, targets and names differ in number");
  std::vector<safetensors::tensor_to_write> tensors;
  for (std::size_t t = 0; t < s.targets.size(); ++t) {
    const target& tg = s.targets[t];
    const auto a = p.adapters[t].lora_A.to_host(), b = p.adapters[t].lora_B.to_host();
    const std::size_t na = static_cast<std::size_t>(s.r * tg.in), nb = static_cast<std::size_t>(tg.out * s.r);
    if (hf_module_patterns[t].find("{i}") == std::string::npos && tg.layers != 1)
      throw hf::error("LoRA: '" + tg.module + "' is stacked but its Hugging Face name has no layer index");
    for (std::int64_t i = 0; i < tg.layers; ++i) {
      const std::string m = "base_model.model." + layer_name(hf_module_patterns[t], i);
      const auto ui = static_cast<std::size_t>(i);
      tensors.push_back({m + ".lora_A.weight", safetensors::dtype::F32, {s.r, tg.in},
                         safetensors::encode_floats(std::span<const float>(a.data() + ui * na, na),
                                                    safetensors::dtype::F32)});
      tensors.push_back({m + ".lora_B.weight", safetensors::dtype::F32, {tg.out, s.r},
                         safetensors::encode_floats(std::span<const float>(b.data() + ui * nb, nb),
                                                    safetensors::dtype::F32)});
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw hf::error("cannot create '" + dir + "': " + ec.message());
  safetensors::write_file((std::filesystem::path(dir) / "adapter_model.safetensors").string(), tensors);
  io::write_file_atomic(std::filesystem::path(dir) / "adapter_config.json",
                        peft_config_json(s, c, base_model, hf_module_patterns));
}

}  // namespace lora
}  // namespace levanter
