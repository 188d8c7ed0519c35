// Tests of levanter/config: YAML decode/encode of every config type, !include, the command line (overrides,
// --help, --dry_run), error messages (key path, file:line, nearest key) and validate().
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <haliax/nn/activation.hpp>
#include <levanter/config/cli.hpp>
#include <levanter/main/train_lm_config.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/config/yaml.hpp>

namespace fs = std::filesystem;
using namespace levanter;
using levanter::config::config_error;

namespace {

/// A fresh directory per test case under the system temp dir.
struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path = fs::temp_directory_path() / ("levanter_test_config_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    fs::path p = path / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
};

config::command_line<TrainLmConfig> parse(std::vector<std::string> args) {
  args.insert(args.begin(), "train_lm");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return config::parse_command_line<TrainLmConfig>(int(argv.size()), argv.data());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const config_error& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

template <class T>
T dec(const std::string& yaml) {
  return config::decode<T>(YAML::Load(yaml), "x");
}

template <class T>
T round_trip(const T& v) {
  return config::decode<T>(YAML::Load(config::to_yaml_string(config::encode(v))), "x");
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += e + "\n";
  return s;
}

// ---- schema walk: every option path of a config type (what --help must list) --------------------------------
template <class S>
void walk(const S& value, const std::string& prefix, std::set<std::string>& out);

template <class M>
void walk_field(const M& v, const std::string& path, std::set<std::string>& out) {
  using namespace config::detail;
  out.insert(path);
  if constexpr (has_schema<M>) {
    walk(v, path, out);
  } else if constexpr (is_choice<M>::value) {
    [&]<class... A>(const config::Choice<A...>*) { (walk(A{}, path, out), ...); }(&v);
  } else if constexpr (is_one_or_many<M>::value) {
    walk_field(v.items.front(), path, out);
  } else if constexpr (is_optional<M>::value) {
    walk_field(typename M::value_type{}, path, out);
  } else if constexpr (is_vector<M>::value) {
    if constexpr (has_schema<typename M::value_type>) walk(typename M::value_type{}, path + "[]", out);
  } else if constexpr (is_variant<M>::value) {
    [&]<class... A>(const std::variant<A...>*) {
      auto one = [&]<class Alt>(Alt*) {
        if constexpr (has_schema<Alt>) walk(Alt{}, path, out);
      };
      (one(static_cast<A*>(nullptr)), ...);
    }(&v);
  }
}

template <class S>
void walk(const S& value, const std::string& prefix, std::set<std::string>& out) {
  std::apply([&](const auto&... f) { (walk_field(value.*(f.member), config::detail::join_key(prefix, f.name), out), ...); },
             config::schema<S>::fields);
}

}  // namespace

// ---- scalars ---------------------------------------------------------------------------------------------------
TEST_CASE("decode scalars: bool, integers, doubles, strings") {
  CHECK(dec<bool>("true") == true);
  CHECK(dec<bool>("False") == false);
  CHECK(dec<int64_t>("400000") == 400000);
  CHECK(dec<int64_t>("-3") == -3);
  CHECK(dec<int>("1e3") == 1000);
  CHECK(dec<double>("1e-3") == doctest::Approx(1e-3));
  CHECK(dec<double>("6E-4") == doctest::Approx(6e-4));
  CHECK(dec<double>("3") == 3.0);
  // infinity and NaN are refused: no config number means them, and they would slip past range checks
  for (const char* nonfinite : {".inf", "-.inf", ".nan", "inf", "+.inf"})
    CHECK_THROWS_WITH_AS(dec<double>(nonfinite), doctest::Contains("expected a finite number"), config_error);
  CHECK(dec<std::string>("hello") == "hello");
  CHECK(dec<std::string>("'10'") == "10");
  CHECK(contains(error_of([] { dec<int>("ten"); }), "x (<yaml>:1): expected an integer, got 'ten'"));
  CHECK(contains(error_of([] { dec<bool>("maybe"); }), "expected a boolean"));
  CHECK(contains(error_of([] { dec<int>("99999999999"); }), "out of range"));
  CHECK(contains(error_of([] { dec<std::string>("[1, 2]"); }), "expected a string, got a list"));
}

TEST_CASE("decode optional, vector, map, variant") {
  CHECK(!dec<std::optional<int>>("null").has_value());
  CHECK(!dec<std::optional<int>>("~").has_value());
  CHECK(dec<std::optional<int>>("4") == 4);
  CHECK(dec<std::vector<std::string>>("[a, b]") == std::vector<std::string>{"a", "b"});
  CHECK(dec<std::vector<int64_t>>("- 1\n- 2\n") == std::vector<int64_t>{1, 2});
  auto m = dec<std::map<std::string, int>>("{a: 1, b: 2}");
  CHECK(m.at("a") == 1);
  CHECK(m.at("b") == 2);
  using V = std::variant<bool, std::string>;
  CHECK(std::get<bool>(dec<V>("true")) == true);
  CHECK(std::get<std::string>(dec<V>("meta-llama/Llama-2-7b")) == "meta-llama/Llama-2-7b");
  CHECK(std::get<std::string>(dec<V>("'true'")) == "true");
  using W = std::variant<bool, int64_t, SkipStepConfig>;
  CHECK(std::get<int64_t>(dec<W>("64")) == 64);
  CHECK(std::get<SkipStepConfig>(dec<W>("{sigma_factor: 3}")).sigma_factor == 3.0);
  CHECK(std::get<SkipStepConfig>(dec<W>("{sigma_factor: 3}")).rolling_interval_length == 128);
  CHECK(contains(error_of([] { dec<W>("[1]"); }), "expected BOOL or INT or MAP"));
}

TEST_CASE("durations parse like pytimeparse and print like encode_timedelta") {
  using config::Duration;
  CHECK(dec<Duration>("5m").seconds == 300);
  CHECK(dec<Duration>("15min").seconds == 900);
  CHECK(dec<Duration>("1h").seconds == 3600);
  CHECK(dec<Duration>("30s").seconds == 30);
  CHECK(dec<Duration>("2d").seconds == 172800);
  CHECK(dec<Duration>("1h30m").seconds == 5400);
  CHECK(dec<Duration>("2 days").seconds == 172800);
  CHECK(dec<Duration>("90").seconds == 90);
  CHECK(dec<Duration>("1:30:00").seconds == 5400);
  CHECK(contains(error_of([] { dec<Duration>("soon"); }), "expected a duration"));
  CHECK(config::to_flow_string(config::encode(Duration::minutes(15))) == "15m");
  CHECK(config::to_flow_string(config::encode(Duration{93784.5})) == "1d2h3m4.5s");
  for (double s : {0.0, 1.0, 59.0, 60.0, 61.5, 3600.0, 86401.0, 900.0})
    CHECK(round_trip(Duration{s}) == Duration{s});
}

TEST_CASE("mixed-precision policies parse as jmp policy strings") {
  using config::dtype;
  using config::MpPolicy;
  CHECK(dec<MpPolicy>("f32") == MpPolicy{dtype::f32, dtype::f32, dtype::f32});
  CHECK(dec<MpPolicy>("float32") == MpPolicy{dtype::f32, dtype::f32, dtype::f32});
  CHECK(dec<MpPolicy>("bfloat16") == MpPolicy{dtype::bf16, dtype::bf16, dtype::bf16});
  CHECK(dec<MpPolicy>("bf16") == MpPolicy{dtype::bf16, dtype::bf16, dtype::bf16});
  CHECK(dec<MpPolicy>("f16") == MpPolicy{dtype::f16, dtype::f16, dtype::f16});
  CHECK(dec<MpPolicy>("float16") == MpPolicy{dtype::f16, dtype::f16, dtype::f16});
  CHECK(dec<MpPolicy>("p=f32,c=bfloat16") == MpPolicy{dtype::f32, dtype::bf16, dtype::bf16});
  CHECK(dec<MpPolicy>("p=f32,c=bfloat16,o=f32") == MpPolicy{dtype::f32, dtype::bf16, dtype::f32});
  CHECK(dec<MpPolicy>("compute=bf16,params=f32") == MpPolicy{dtype::f32, dtype::bf16, dtype::bf16});
  CHECK(contains(error_of([] { dec<MpPolicy>("p=f32,x=bf16"); }), "unknown key 'x'"));
  CHECK(contains(error_of([] { dec<MpPolicy>("int8"); }), "unknown dtype 'int8'"));
  // Strict: a key given twice is not "the last one wins", and an empty entry (a trailing or doubled comma) is refused.
  CHECK(contains(error_of([] { dec<MpPolicy>("p=f32,p=bfloat16"); }), "'p' is given twice"));
  CHECK(contains(error_of([] { dec<MpPolicy>("c=bf16,compute=f32"); }), "'compute' is given twice"));
  CHECK(contains(error_of([] { dec<MpPolicy>("p=f32,c=bfloat16,"); }), "an empty entry"));
  CHECK(contains(error_of([] { dec<MpPolicy>("p=f32,,c=bfloat16"); }), "an empty entry"));
  for (auto m : {MpPolicy{}, MpPolicy{dtype::f32, dtype::bf16, dtype::bf16}, MpPolicy{dtype::f32, dtype::bf16, dtype::f32}})
    CHECK(round_trip(m) == m);
}

TEST_CASE("int schedules, string-or-list, number-or-list, opaque") {
  using namespace config;
  CHECK(dec<IntSchedule>("32") == IntSchedule(32));
  auto s = dec<IntSchedule>("[{start: 0, value: 64}, {start: 64, value: 128}]");
  REQUIRE(s.steps.size() == 2);
  CHECK(s.at(0) == 64);
  CHECK(s.at(100) == 128);
  CHECK(round_trip(s) == s);
  CHECK(round_trip(IntSchedule(7)) == IntSchedule(7));
  CHECK(contains(error_of([] { dec<IntSchedule>("[{start: 0, valu: 1}]"); }), "unknown key 'x[0].valu'"));

  auto one = dec<StringOrList>("embed");
  CHECK(one.items == std::vector<std::string>{"embed"});
  CHECK(!one.is_list);
  auto lst = dec<StringOrList>("[embed, mlp]");
  CHECK(lst.is_list);
  CHECK(round_trip(one) == one);
  CHECK(round_trip(lst) == lst);

  auto n = dec<NumberOrList>("0.25");
  CHECK(n.number == 0.25);
  auto l = dec<NumberOrList>("[100, 300]");
  CHECK(l.is_list());
  CHECK(l.list == std::vector<int64_t>{100, 300});
  CHECK(round_trip(n) == n);
  CHECK(round_trip(l) == l);

  auto o = dec<Opaque>("{type: ema, beta: 0.999}");
  CHECK(o.set);
  CHECK(contains(o.yaml, "ema"));
  CHECK(o.where == "<yaml>:1");
  CHECK(!dec<Opaque>("null").set);
  auto o2 = round_trip(o);
  CHECK(o2.set);
  CHECK(o2.yaml == o.yaml);
}

TEST_CASE("choices: type key, bare name, default, unknown and unsupported types") {
  auto c = dec<LrScheduleChoice>("{type: inv_sqrt, timescale: 500}");
  REQUIRE(c.get_if<InvSqrtLrSchedule>());
  CHECK(c.get_if<InvSqrtLrSchedule>()->timescale == 500);
  CHECK(dec<LrScheduleChoice>("linear").type_name() == "linear");
  CHECK(dec<LrScheduleChoice>("{exponent: 2}").get_if<CosineLrSchedule>()->exponent == 2);
  CHECK(round_trip(c).get_if<InvSqrtLrSchedule>()->timescale == 500);
  std::string e = error_of([] { dec<LrScheduleChoice>("{type: wsd}"); });
  CHECK(contains(e, "x.type (<yaml>:1): unknown type 'wsd'; supported types: {cosine,constant,linear,inv_sqrt,inv,power}"));
  CHECK(dec<OptimizerChoice>("{type: lion, beta1: 0.8}").get_if<LionConfig>()->beta1 == 0.8);
  CHECK(dec<OptimizerChoice>("{type: mars, weight_decay: 0.2}").get_if<MarsConfig>()->weight_decay == 0.2);
  CHECK(round_trip(dec<OptimizerChoice>("{type: rmsprop, eps: 1e-20}")).get_if<RMSPropMomentumConfig>()->eps == 1e-20);
  CHECK(dec<OptimizerChoice>("{type: muon, momentum: 0.9}").get_if<MuonConfig>()->momentum == 0.9);
  CHECK(dec<OptimizerChoice>("muon").get_if<MuonConfig>()->weight_decay == 0.0);  // upstream re-defaults it
  CHECK(dec<OptimizerChoice>("{type: scion}").get_if<ScionConfig>()->backend_steps == 10);
  CHECK(round_trip(dec<OptimizerChoice>("{type: mini, beta2: 0.9}")).get_if<MiniConfig>()->beta2 == 0.9);
  CHECK(round_trip(dec<OptimizerChoice>("{type: soap, beta1: 0.9}")).get_if<SoapConfig>()->beta1 == 0.9);
  CHECK(dec<OptimizerChoice>("soap").get_if<SoapConfig>()->weight_decay == 0.0);  // upstream re-defaults it
  CHECK(round_trip(dec<OptimizerChoice>("{type: kron, block_size: 128}")).get_if<KronConfig>()->block_size == 128);
  CHECK(dec<OptimizerChoice>("kron").get_if<KronConfig>()->weight_decay == 0.1);
  const auto sophia = round_trip(dec<OptimizerChoice>("{type: sophia-h, gamma: 0.02, clip_threshold: null}"));
  REQUIRE(sophia.get_if<SophiaHConfig>());
  CHECK(sophia.get_if<SophiaHConfig>()->gamma == 0.02);
  CHECK_FALSE(sophia.get_if<SophiaHConfig>()->clip_threshold);
  CHECK(dec<OptimizerChoice>("sophia-h").get_if<SophiaHConfig>()->update_interval == 10);
  e = error_of([] { dec<OptimizerChoice>("{type: sophia-g}"); });  // upstream's is commented out
  CHECK(contains(e, "unknown type 'sophia-g'; supported types: {adam,lion,adopt,rmsprop,cautious,mars,muon,scion,mini,soap,kron,sophia-h}"));
  e = error_of([] { dec<OptimizerChoice>("{type: lion, nesterov: true}"); });
  CHECK(contains(e, "nesterov"));
  e = error_of([] { dec<ModelChoice>("whisper"); });
  CHECK(contains(e, "whisper is not supported yet; use type: gpt2 or llama"));
  CHECK(dec<ModelChoice>("{type: mixtral, n_routed_experts: 4}").get_if<MixtralConfig>()->n_routed_experts == 4);
  CHECK(dec<ModelChoice>("llama").type_name() == "llama");
  CHECK(dec<ModelChoice>("{type: qwen, use_sliding_window: true, sliding_window: 8}").get_if<QwenConfig>()->family ==
        &llama_family::qwen2);
  CHECK(round_trip(dec<ModelChoice>("{type: mistral, sliding_window: 16}")).get_if<MistralConfig>()->sliding_window ==
        16);
  // no type: the class whose keys fit (upstream's default tracker is wandb)
  auto t = dec<TrackerChoice>("{project: levanter, tags: [a]}");
  CHECK(t.type_name() == "wandb");
  CHECK(dec<TrackerChoice>("{}").type_name() == "json_logger");

  auto many = dec<config::OneOrMany<TrackerChoice>>("[{type: json_logger}, {type: noop}]");
  CHECK(many.is_list);
  REQUIRE(many.items.size() == 2);
  CHECK(many.items[1].type_name() == "noop");
  auto single = dec<config::OneOrMany<TrackerChoice>>("{type: noop}");
  CHECK(!single.is_list);
  CHECK(single.items.front().type_name() == "noop");
  CHECK(round_trip(many).items.size() == 2);
  CHECK(!round_trip(single).is_list);
}

TEST_CASE("structs: unknown key suggests the nearest, wrong type names key, file and line") {
  std::string e = error_of([] { dec<TrainerConfig>("seed: 1\nnum_train_step: 10\n"); });
  CHECK(contains(e, "unknown key 'x.num_train_step' (<yaml>:2); did you mean 'num_train_steps'?"));
  e = error_of([] { dec<TrainerConfig>("seed: 1\n\nnum_train_steps: ten\n"); });
  CHECK(contains(e, "x.num_train_steps (<yaml>:3): expected an integer, got 'ten'"));
  e = error_of([] { dec<TrainerConfig>("zzzzzzzzzzzzzzzzzzzzzzzzzz: 1\n"); });
  CHECK(contains(e, "valid keys: seed, mp"));
  // every problem is reported, not only the first
  e = error_of([] { dec<TrainerConfig>("seed: a\nnum_train_steps: b\n"); });
  CHECK(contains(e, "x.seed"));
  CHECK(contains(e, "x.num_train_steps"));
}

TEST_CASE("full TrainLmConfig round-trips through YAML") {
  TrainLmConfig c;
  c.trainer.num_train_steps = 77;
  c.trainer.train_batch_size = config::IntSchedule{};
  c.trainer.train_batch_size.steps = {{0, 8}, {10, 16}};
  c.trainer.mp = config::MpPolicy{config::dtype::f32, config::dtype::bf16, config::dtype::bf16};
  c.trainer.checkpointer.keep = {{100, 1000}, {500, std::nullopt}};
  c.trainer.tracker.items = {TrackerChoice{NoopTrackerConfig{}}, TrackerChoice{JsonLoggerConfig{"x", "DEBUG"}}};
  c.trainer.tracker.is_list = true;
  c.trainer.fsdp_axis = config::StringOrList{};
  c.trainer.fsdp_axis.items = {"embed", "mlp"};
  c.trainer.fsdp_axis.is_list = true;
  c.trainer.axis_resources["batch"] = config::StringOrList("data");
  c.data.train_urls = {"a.jsonl", "true", "10"};
  c.data.shuffle = int64_t(1024);
  c.initialize_from_hf = std::string("false");
  auto& a = std::get<AdamConfig>(c.optimizer.value);
  a.lr_schedule.value = PowerLrSchedule{256, 1024, 4.6, -0.51};
  a.cycles = config::NumberOrList{std::nullopt, {100, 300}};
  a.skip_bad_steps = SkipStepConfig{64, 5};
  a.clip_update_norm = ClipUpdateNormConfig{};
  a.learning_rate = 3e-4;
  std::get<Gpt2Config>(c.model.value).hidden_dim = 64;
  c.trainer.quantization = config::decode<config::Opaque>(YAML::Load("{fp8: true}"));

  std::string y = config::to_yaml_string(c);
  auto back = config::decode<TrainLmConfig>(YAML::Load(y));
  CHECK(config::to_yaml_string(back) == y);
  CHECK(back.trainer.num_train_steps == 77);
  CHECK(back.trainer.train_batch_size == c.trainer.train_batch_size);
  CHECK(back.trainer.mp == c.trainer.mp);
  CHECK(back.trainer.checkpointer.keep.size() == 2);
  CHECK(back.trainer.checkpointer.keep[0].until == 1000);
  CHECK(back.trainer.tracker.items[1].get_if<JsonLoggerConfig>()->level == "DEBUG");
  CHECK(back.trainer.fsdp_axis == c.trainer.fsdp_axis);
  CHECK(back.trainer.axis_resources == c.trainer.axis_resources);
  CHECK(back.data.train_urls == c.data.train_urls);
  CHECK(std::get<int64_t>(back.data.shuffle) == 1024);
  CHECK(std::get<std::string>(back.initialize_from_hf) == "false");
  const auto& b = std::get<AdamConfig>(back.optimizer.value);
  CHECK(b.lr_schedule.get_if<PowerLrSchedule>()->batch_size == 256);
  CHECK(b.cycles == a.cycles);
  CHECK(std::get<SkipStepConfig>(b.skip_bad_steps).rolling_interval_length == 64);
  CHECK(b.clip_update_norm.has_value());
  CHECK(b.learning_rate == 3e-4);
  CHECK(std::get<Gpt2Config>(back.model.value).hidden_dim == 64);
  CHECK(back.trainer.quantization.set);
  // the default config round-trips too, and decoding an empty document gives the defaults
  TrainLmConfig d;
  CHECK(config::to_yaml_string(config::decode<TrainLmConfig>(YAML::Load(config::to_yaml_string(d)))) ==
        config::to_yaml_string(d));
  CHECK(config::to_yaml_string(config::decode<TrainLmConfig>(YAML::Load(""))) == config::to_yaml_string(d));
}

TEST_CASE("defaults equal upstream") {
  TrainLmConfig c;
  const auto& t = c.trainer;
  CHECK(t.seed == 0);
  CHECK(t.num_train_steps == 400000);
  CHECK(t.train_batch_size == config::IntSchedule(512));
  CHECK(t.per_device_parallelism == -1);
  CHECK(t.steps_per_eval == 1000);
  CHECK(t.log_dir == "logs/");
  CHECK(t.mp == config::MpPolicy{});
  CHECK(t.checkpointer.base_path == "checkpoints/");
  CHECK(t.checkpointer.save_interval.seconds == 900);
  CHECK(t.checkpointer.keep.size() == 1);
  CHECK(t.checkpointer.keep[0].every == 10000);
  CHECK(t.fsdp_axis.items == std::vector<std::string>{"embed"});
  CHECK(c.data.tokenizer == "gpt2");
  CHECK(c.data.cache_dir == "cache/");
  CHECK(c.data.ignore_token_id == -100);
  const auto& a = std::get<AdamConfig>(c.optimizer.value);
  CHECK(a.learning_rate == 6e-4);
  CHECK(a.weight_decay == 0.1);
  CHECK(a.min_lr_ratio == 0.1);
  CHECK(a.warmup == 0.01);
  CHECK(a.beta1 == 0.9);
  CHECK(a.beta2 == 0.95);
  CHECK(a.epsilon == 1e-8);
  CHECK(a.max_grad_norm == 1.0);
  CHECK(a.lr_schedule.type_name() == "cosine");
  const auto& m = std::get<Gpt2Config>(c.model.value);
  CHECK(m.seq_len == 1024);
  CHECK(m.hidden_dim == 768);
  CHECK(m.num_layers == 12);
  CHECK(m.num_heads == 12);
  CHECK(m.activation_function == "gelu_new");
  CHECK(m.layer_norm_epsilon == 1e-5);
  CHECK(c.hf_save_steps == 10000);
  CHECK(c.z_loss_weight == 0.0);
}

// ---- files and includes ---------------------------------------------------------------------------------------
TEST_CASE("include: relative path, nested, positions name the included file") {
  temp_dir d("include");
  d.write("conf/data/src.yaml", "train_urls: [a.jsonl]\ntokenizer: byte\nformat: !include fmt/text.yaml\n");
  d.write("conf/data/fmt/text.yaml", "type: text\ntext_key: body\n");
  std::string main = d.write("conf/main.yaml", "data: !include data/src.yaml\ntrainer:\n  num_train_steps: 5\n");
  auto r = parse({main});
  CHECK(r.config.data.train_urls == std::vector<std::string>{"a.jsonl"});
  CHECK(r.config.data.format.set);
  CHECK(contains(r.config.data.format.yaml, "body"));
  CHECK(contains(r.sources.at("data.train_urls"), "src.yaml:1"));
  CHECK(contains(r.sources.at("data.format.text_key"), "text.yaml:2"));
  CHECK(contains(r.sources.at("trainer.num_train_steps"), "main.yaml:3"));
  d.write("conf/data/bad.yaml", "train_urls: [a]\n\ntokenizr: byte\n");
  std::string bad = d.write("conf/bad_main.yaml", "data: !include data/bad.yaml\n");
  std::string e = error_of([&] { parse({bad}); });
  CHECK(contains(e, "unknown key 'data.tokenizr' ("));
  CHECK(contains(e, "bad.yaml:3); did you mean 'tokenizer'?"));
}

TEST_CASE("include: missing file and cycles are errors") {
  temp_dir d("include_err");
  std::string main = d.write("main.yaml", "trainer:\n  seed: 1\ndata: !include nowhere.yaml\n");
  std::string e = error_of([&] { parse({main}); });
  CHECK(contains(e, "main.yaml:3"));
  CHECK(contains(e, "included file 'nowhere.yaml' not found"));
  d.write("a.yaml", "data: !include b.yaml\n");
  d.write("b.yaml", "format: !include a.yaml\n");
  e = error_of([&] { parse({(d.path / "a.yaml").string()}); });
  CHECK(contains(e, "!include cycle: "));
  CHECK(contains(e, "a.yaml -> "));
  CHECK(contains(e, "b.yaml -> "));
}

TEST_CASE("command line: config path forms, overrides, merges") {
  temp_dir d("cli");
  std::string f = d.write("x.yaml",
                          "trainer:\n  num_train_steps: 100\n  train_batch_size: 32\n"
                          "optimizer:\n  learning_rate: 0.01\n  lr_schedule: cosine\nmodel:\n  type: gpt2\n  hidden_dim: 32\n");
  auto r = parse({f, "--trainer.num_train_steps", "10", "--trainer.seed=3", "--data.train_urls", "[\"a\",\"b\"]",
                  "--optimizer.lr_schedule.exponent", "2", "--model.type", "gpt2", "--data.format.text_key", "body"});
  CHECK(r.config_path == f);
  CHECK(r.config.trainer.num_train_steps == 10);
  CHECK(r.config.trainer.seed == 3);
  CHECK(r.config.trainer.train_batch_size == config::IntSchedule(32));
  CHECK(r.config.data.train_urls == std::vector<std::string>{"a", "b"});
  const auto& a = std::get<AdamConfig>(r.config.optimizer.value);
  CHECK(a.learning_rate == 0.01);
  CHECK(a.lr_schedule.get_if<CosineLrSchedule>()->exponent == 2);
  CHECK(std::get<Gpt2Config>(r.config.model.value).hidden_dim == 32);
  CHECK(r.sources.at("trainer.num_train_steps") == "command line");
  CHECK(contains(r.sources.at("trainer.train_batch_size"), "x.yaml:3"));
  CHECK(contains(r.resolved_yaml, "num_train_steps: 10"));

  auto r2 = parse({"--config_path", f, "--optimizer", "{type: adam, learning_rate: 1e-3}"});
  CHECK(std::get<AdamConfig>(r2.config.optimizer.value).learning_rate == 1e-3);
  auto r3 = parse({"--config_path=" + f, "--optimizer.lr_schedule", "{type: inv_sqrt, timescale: 10}"});
  CHECK(std::get<AdamConfig>(r3.config.optimizer.value).lr_schedule.get_if<InvSqrtLrSchedule>()->timescale == 10);

  std::string g = d.write("y.yaml", "trainer:\n  seed: 9\noptimizer:\n  weight_decay: 0.0\n");
  auto r4 = parse({"--configs", f, g, "--dry_run"});
  CHECK(r4.dry_run);
  CHECK(r4.config.trainer.seed == 9);
  CHECK(r4.config.trainer.num_train_steps == 100);
  CHECK(std::get<AdamConfig>(r4.config.optimizer.value).weight_decay == 0.0);
  CHECK(std::get<AdamConfig>(r4.config.optimizer.value).learning_rate == 0.01);
  CHECK(contains(r4.sources.at("trainer.seed"), "y.yaml:2"));

  // no config: the embedded default
  const char* argv[] = {"train_lm", "--trainer.seed", "4"};
  auto r5 = config::parse_command_line<TrainLmConfig>(3, argv, "trainer:\n  num_train_steps: 12\n", "<embedded>");
  CHECK(r5.config.trainer.num_train_steps == 12);
  CHECK(r5.config.trainer.seed == 4);
  CHECK(r5.sources.at("trainer.num_train_steps") == "<embedded>:2");
}

TEST_CASE("command line: errors name the key, position and fix") {
  temp_dir d("cli_err");
  std::string f = d.write("x.yaml", "trainer:\n  seed: 0\n\n\n\n\n  num_train_step: 3\n");
  std::string e = error_of([&] { parse({f}); });
  CHECK(contains(e, "unknown key 'trainer.num_train_step' (" + f + ":7); did you mean 'num_train_steps'?"));
  std::string ok = d.write("ok.yaml", "trainer:\n  seed: 0\n");
  e = error_of([&] { parse({ok, "--trainer.num_train_step", "10"}); });
  CHECK(contains(e, "unknown key 'trainer.num_train_step' (command line); did you mean 'num_train_steps'?"));
  e = error_of([&] { parse({ok, "--optimizer.lr_schedule.exponnt", "2"}); });
  CHECK(contains(e, "unknown key 'optimizer.lr_schedule.exponnt' (command line); did you mean 'exponent'?"));
  e = error_of([&] { parse({ok, "--trainer.seed", "abc"}); });
  CHECK(contains(e, "trainer.seed (command line): expected an integer, got 'abc'"));
  e = error_of([&] { parse({"does_not_exist.yaml"}); });
  CHECK(contains(e, "config file 'does_not_exist.yaml' not found (working directory: "));
  e = error_of([&] { parse({ok, "--trainer.seed"}); });
  CHECK(contains(e, "needs a value"));
  std::string bad = d.write("bad.yaml", "trainer: [1,\n");
  e = error_of([&] { parse({bad}); });
  CHECK(contains(e, "YAML syntax error"));
}

TEST_CASE("help lists every option with type, default and doc") {
  auto r = parse({"--help"});
  CHECK(r.help);
  std::string h = config::help_text<TrainLmConfig>("train_lm");
  CHECK(contains(h, "--trainer.seed INT (default 0): seed of the PRNG key"));
  CHECK(contains(h, "--optimizer.lr_schedule {cosine,constant,linear,inv_sqrt,inv,power} (default cosine)"));
  CHECK(contains(h, "--trainer.checkpointer.save_interval DURATION (default 15m)"));
  CHECK(contains(h, "with type: power"));
  std::set<std::string> paths;
  walk(TrainLmConfig{}, "", paths);
  CHECK(paths.size() > 150);
  std::vector<std::string> missing;
  for (const auto& p : paths)
    if (!contains(h, "--" + p + " ") && !contains(h, "--" + p + ":")) missing.push_back(p);
  CHECK_MESSAGE(missing.empty(), "missing from --help: " << joined(missing));
}

// ---- validation ------------------------------------------------------------------------------------------------
namespace {
config::validation_result validate_yaml(const std::string& yaml, std::vector<std::string> extra = {}) {
  temp_dir d("validate");
  std::string f = d.write("v.yaml", yaml);
  extra.insert(extra.begin(), f);
  auto r = parse(extra);
  return levanter::validate_train_lm(r.config, r.sources);
}
const std::string kGood =
    "data:\n  tokenizer: byte\n  train_urls: [train.jsonl]\n"
    "model:\n  type: gpt2\n  hidden_dim: 32\n  num_heads: 4\n  num_layers: 2\n  seq_len: 64\n"
    "trainer:\n  num_train_steps: 10\n  train_batch_size: 8\n  tracker: {type: json_logger}\n";
}  // namespace

TEST_CASE("validate accepts a plain local config") {
  auto v = validate_yaml(kGood);
  CHECK_MESSAGE(v.ok(), joined(v.errors));
  CHECK(v.notes.empty());
}

TEST_CASE("validate: impossible values") {
  auto v = validate_yaml(kGood, {"--trainer.train_batch_size", "-4"});
  CHECK(contains(joined(v.errors), "trainer.train_batch_size (command line): train_batch_size must be positive"));
  v = validate_yaml(kGood, {"--trainer.train_batch_size", "32", "--trainer.per_device_parallelism", "5"});
  CHECK(contains(joined(v.errors), "train_batch_size 32 is not divisible by per_device_parallelism 5"));
  v = validate_yaml(kGood, {"--trainer.train_batch_size", "[{start: 0, value: 8}, {start: 10, value: 0}]"});
  CHECK(contains(joined(v.errors), "trainer.train_batch_size[1] (command line): train_batch_size must be positive"));
  v = validate_yaml(kGood, {"--trainer.num_train_steps", "0", "--trainer.steps_per_eval", "0",
                            "--trainer.max_eval_batches", "-1"});
  CHECK(v.errors.size() == 3);
  v = validate_yaml(kGood, {"--model.num_heads", "5"});
  CHECK(contains(joined(v.errors), "model.num_heads (command line): hidden_dim 32 is not divisible by num_heads 5"));
  v = validate_yaml(kGood, {"--model.seq_len", "0", "--model.attn_pdrop", "1.0", "--model.activation_function", "gelu2"});
  CHECK(contains(joined(v.errors), "model.seq_len"));
  CHECK(contains(joined(v.errors), "model.attn_pdrop"));
  CHECK(contains(joined(v.errors), "unknown activation 'gelu2'"));
  // One registry: every name the message lists is accepted, and tanh (listed by an older, drifted copy) is not.
  v = validate_yaml(kGood, {"--model.activation_function", "tanh"});
  CHECK(contains(joined(v.errors), "model.activation_function (command line): unknown activation 'tanh'; use one of "
                                   "relu, gelu, gelu_new, quick_gelu, silu, swish"));
  for (const auto& e : haliax::nn::activation_table) {
    v = validate_yaml(kGood, {"--model.activation_function", std::string(e.name)});
    CHECK_MESSAGE(v.errors.empty(), e.name);
  }
  v = validate_yaml(kGood, {"--optimizer", "{learning_rate: -1, beta1: 1.0, beta2: -0.1, epsilon: 0, warmup: -1, "
                                          "min_lr_ratio: 2}"});
  for (const char* k : {"optimizer.learning_rate", "optimizer.beta1", "optimizer.beta2", "optimizer.epsilon",
                        "optimizer.warmup", "optimizer.min_lr_ratio"})
    CHECK_MESSAGE(contains(joined(v.errors), k), k);
  v = validate_yaml(kGood, {"--trainer.checkpointer.keep", "[{every: 10}, {every: 100, until: 50}, {every: 0}]"});
  CHECK(contains(joined(v.errors), "trainer.checkpointer.keep[0].until"));
  CHECK(contains(joined(v.errors), "trainer.checkpointer.keep[2].every"));
  v = validate_yaml(kGood, {"--trainer.checkpointer.keep", "[{every: 10, until: 100}, {every: 100, until: 50}]"});
  CHECK(contains(joined(v.errors), "increasing 'until'"));
  v = validate_yaml(kGood, {"--optimizer.cycles", "2", "--optimizer.cycle_length", "100"});
  CHECK(contains(joined(v.errors), "at most one of cycle_length, cycles and haps"));
  v = validate_yaml(kGood, {"--optimizer.lr_schedule", "power"});
  CHECK(contains(joined(v.errors), "the power schedule needs batch_size and seq_length"));
  v = validate_yaml(kGood, {"--optimizer.update_rms_clipping", "1.0", "--optimizer.clip_update_norm", "{}"});
  CHECK(contains(joined(v.errors), "cannot be combined with clip_update_norm"));
}

TEST_CASE("validate: unsupported features are refused with what to use instead") {
  struct refusal {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<refusal> cases = {
      {{"--data.id", "dlwh/wikitext"}, "data.id (command line): Hugging Face datasets"},
      {{"--data.train_urls", "[\"gs://bucket/a.jsonl\"]"}, "data.train_urls[0] (command line): 'gs://bucket/a.jsonl' is a remote URL"},
      {{"--data.validation_urls", "[\"hf://x\"]"}, "use a local"},
      {{"--data.train_weights", "{a: 1}"}, "mixture weights need data.configs"},
      {{"--data.stop_strategy", "first"}, "data.stop_strategy (command line): unknown stop strategy 'first': use restart, first_exhausted or all_exhausted"},
      {{"--data.target_budget", "1000"}, "data.target_budget"},
      {{"--data.bad_documents", "ignore"}, "unknown policy 'ignore': use stop or skip"},
      {{"--data.cache_options", "{target_size_per_flush: lots}"}, "'lots' is not a size"},
      {{"--viz.every", "-1"}, "viz.every"},
      {{"--data.format", "{type: chat, chat_template: [a, b]}"},
       "data.format.chat_template (command line): expected the template's text"},
      {{"--data.configs", "{a: {train_urls: [a.jsonl], format: {type: chat, messages_field: {x: 1}}}}",
        "--data.train_urls", "[]", "--data.validation_urls", "[]"},
       "data.configs.a.format.messages_field (command line): expected a field name"},
      {{"--data.format", "{type: chat, single_turn: true, chat_template: \"{{ x }}\"}"},
       "data.format.chat_template (command line): chat templates are not supported for single-turn chat"},
      {{"--data.format", "{type: chat, single_turn: true, mask_inputs: false}"},
       "data.format.mask_inputs (command line): not a key of format 'chat' (messages_field, single_turn"},
      {{"--data.configs", "{a: {train_urls: [a.jsonl], format: {type: supervised, text_key: q}}}",
        "--data.train_urls", "[]", "--data.validation_urls", "[]"},
       "data.configs.a.format.text_key (command line): not a key of format 'supervised' (input_field, output_field"},
      {{"--data.format", "{type: supervised, pack: maybe}"}, "data.format.pack (command line): expected true or false"},
      {{"--data.format", "{type: parquet}"}, "data.format (command line): unknown format 'parquet'; use text, supervised or chat"},
      {{"--data.tokenizer", "meta-llama/Llama-2-7b-hf"}, "pass a local tokenizer.json path, or use tokenizer: byte"},
      {{"--data.tokenizer", "gpt2"}, "Hugging Face hub tokenizers need a download"},
      {{"--trainer.tracker", "{type: wandb}"}, "trainer.tracker (command line): the wandb tracker needs the Weights & Biases service"},
      {{"--trainer.tracker", "[{type: json_logger}, {type: tensorboard, logdir: \"gs://b/tb\"}]"}, "'gs://b/tb' is a remote URL"},
      {{"--trainer.tracker", "{type: wandb}"}, "use tracker: {type: tensorboard}"},
      {{"--trainer.wandb", "{project: x}"}, "trainer.wandb"},
      {{"--trainer.quantization", "{fp8: true}"}, "trainer.quantization"},
      {{"--trainer.model_averaging", "{type: ema, beta: 1.5}"}, "trainer.model_averaging.beta"},
      {{"--trainer.watch", "{watch_targets: [grads, gradz]}"}, "trainer.watch.watch_targets[1] (command line): unknown watch target 'gradz'"},
      {{"--trainer.watch", "{interval: -1}"}, "trainer.watch.interval"},
      {{"--trainer.profiler", "true", "--trainer.profiler_num_steps", "0"}, "trainer.profiler_num_steps"},
      {{"--initialize_from_hf", "true"}, "initialize_from_hf"},
      {{"--initialize_from_hf", "hf://openai-community/gpt2"}, "initialize_from_hf (command line): 'hf://openai-community/gpt2' is a remote URL"},
      {{"--use_hf_model_config", "true"}, "use_hf_model_config (command line): takes the model config from initialize_from_hf"},
      {{"--hf_save_path", "gs://bucket/hf"}, "hf_save_path (command line): 'gs://bucket/hf' is a remote URL"},
      {{"--hf_save_dtype", "int8"}, "hf_save_dtype (command line): unknown dtype 'int8'"},
      {{"--hf_upload", "me/model"}, "hf_upload"},
      {{"--eval_harness", "{task_spec: [x]}"}, "eval_harness"},
      {{"--log_entropy", "true"}, "log_entropy"},
      {{"--initialize_from_checkpoint_path", "s3://b/ckpt"}, "initialize_from_checkpoint_path (command line): 's3://b/ckpt' is a remote URL"},
      {{"--trainer.initialize_from", "gs://b/run"}, "trainer.initialize_from (command line): 'gs://b/run' is a remote URL"},
      {{"--epoch", "-1"}, "epoch (command line): must be in [0, 1048576]"},
      {{"--epoch", "2", "--data.configs", "{a: {train_urls: [a.jsonl]}}", "--data.train_urls", "[]",
        "--data.validation_urls", "[]"},
       "epoch (command line): epochs are not supported for mixture datasets"},
      {{"--trainer.mp", "p=f32,c=f16"}, "trainer.mp (command line): float16"},
      {{"--optimizer.cooldown", "0.1"}, "optimizer.cooldown (command line): cooldown is deprecated upstream"},
      {{"--optimizer.haps", "[10]"}, "use cycles"},
      {{"--model.attn_backend", "splash"}, "model.attn_backend"},
      {{"--data.permutation_type", "random"}, "use linear or feistel"},
      {{"--trainer.model_axis_size", "0"}, "trainer.model_axis_size (command line): must be positive"},
  };
  for (const auto& c : cases) {
    auto v = validate_yaml(kGood, c.args);
    CHECK_MESSAGE(contains(joined(v.errors), c.expected), c.args[0] << " -> " << joined(v.errors));
  }
  // bf16 compute is accepted with a note (it runs in f32 here); JAX-only keys are notes
  auto v = validate_yaml(kGood, {"--trainer.mp", "p=f32,c=bfloat16", "--trainer.jax_config", "{a: 1}",
                                 "--trainer.log_jaxprs", "false", "--trainer.require_accelerator", "false"});
  CHECK_MESSAGE(v.ok(), joined(v.errors));
  CHECK(v.notes.size() == 4);
  CHECK(contains(joined(v.notes), "trainer.mp"));
  CHECK(contains(joined(v.notes), "trainer.jax_config (command line): ignored (JAX-specific)"));
  // Checkpoint and Hugging Face settings with local paths are fine.
  v = validate_yaml(kGood, {"--trainer.checkpointer.save_interval", "5m", "--trainer.initialize_from", "other/run",
                            "--initialize_from_hf", "models/gpt2", "--use_hf_model_config", "true", "--hf_save_path",
                            "hf", "--hf_save_dtype", "bfloat16", "--initialize_from_checkpoint_path", "ckpt/step-10"});
  CHECK_MESSAGE(v.ok(), joined(v.errors));
  CHECK(v.notes.empty());
  v = validate_yaml(kGood, {"--data.tokenizer", "/models/tokenizer.json", "--data.shuffle", "true",
                            "--data.permutation_type", "feistel", "--trainer.tensor_parallel_axes", "[heads, mlp]"});
  CHECK_MESSAGE(v.ok(), joined(v.errors));
}

// ---- robustness: limits on what a config may make the reader do ---------------------------------------------------
namespace {
/// The error of parsing a command line (config files and overrides), or "<no error>".
std::string parse_error(const std::vector<std::string>& args) {
  return error_of([&] { (void)parse(args); });
}
/// The errors of parsing and validating a command line, as one string.
std::string problems(const std::vector<std::string>& args) {
  std::string out;
  try {
    auto r = parse(args);
    out = joined(levanter::validate_train_lm(r.config, r.sources).errors);
  } catch (const config_error& e) {
    out = e.what();
  }
  return out;
}
}  // namespace

TEST_CASE("yaml limits: an alias that refers to itself is refused (not a stack overflow)") {
  temp_dir d("alias_cycle");
  for (const std::string text : {"a: &x [*x]\n", "a: &x {b: *x}\n", "data: &x\n  tags: [*x]\n",
                                 "a: &x [1, [2, {b: [*x]}]]\n"}) {
    std::string f = d.write("c.yaml", text);
    std::string e = parse_error({f});
    CHECK_MESSAGE(contains(e, "an alias (*name) refers to a map or list that contains it"), text << " -> " << e);
    CHECK_MESSAGE(contains(e, f), e);
  }
  // the same through a command-line value
  std::string e = parse_error({"--data.tags", "&x [*x]"});
  CHECK_MESSAGE(contains(e, "command line (--data.tags)"), e);
  CHECK(contains(e, "refers to a map or list that contains it"));
  // an alias used twice side by side is fine (no cycle)
  std::string f = d.write("ok.yaml", "data:\n  tags: &t [a, b]\n  train_urls: *t\n");
  CHECK(parse_error({f}) == "<no error>");
}

TEST_CASE("yaml limits: billion laughs stops at the node budget, quickly") {
  temp_dir d("laughs");
  std::string text = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  for (int i = 1; i < 10; ++i) {
    text += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) text += (k ? ", *a" : "*a") + std::to_string(i - 1);
    text += "]\n";
  }
  std::string f = d.write("laughs.yaml", text);
  const auto t0 = std::chrono::steady_clock::now();
  std::string e = parse_error({f});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK_MESSAGE(contains(e, f + ": the YAML expands to more than 200,000 nodes"), e);
  CHECK(contains(e, "billion laughs"));
  CHECK(secs < 20);
  // long values repeated through aliases hit the byte budget
  std::string big(4000, 'x');
  text = "a0: &a0 [" + big + "]\na1: &a1 [";
  for (int k = 0; k < 20000; ++k) text += k ? ", *a0" : "*a0";
  text += "]\n";
  f = d.write("wide.yaml", text);
  e = parse_error({f});
  CHECK_MESSAGE(contains(e, "the YAML expands to more than 64 MiB of values and key paths"), e);
}

TEST_CASE("yaml limits: nesting deeper than 64 levels is refused, in the file, across includes and in yaml-cpp") {
  temp_dir d("deep");
  // trainer.jax_config takes any YAML (it is ignored): depth 2 + n
  auto nested = [](int n) {
    return "trainer:\n  jax_config: " + std::string(std::size_t(n), '[') + std::string(std::size_t(n), ']') + "\n";
  };
  CHECK(parse_error({d.write("ok.yaml", nested(60))}) == "<no error>");
  std::string f = d.write("deep.yaml", nested(80));
  std::string e = parse_error({f});
  CHECK_MESSAGE(contains(e, f + ":2: maps and lists nested more than 64 levels deep (the limit is 64"), e);
  // 100,000 levels: yaml-cpp's own recursion guard fires; the message is ours
  f = d.write("deeper.yaml", "a: " + std::string(100000, '[') + "\n");
  e = parse_error({f});
  CHECK_MESSAGE(contains(e, "nested more than 64 levels deep"), e);
  f = d.write("dashes.yaml", [] {
    std::string s;
    for (int i = 0; i < 100000; ++i) s += "- ";
    return s + "x\n";
  }());
  e = parse_error({f});
  CHECK_MESSAGE(contains(e, "nested more than 64 levels deep"), e);
  // 40 + 40 levels across an !include
  d.write("inner.yaml", "b: " + std::string(40, '[') + std::string(40, ']') + "\n");
  f = d.write("outer.yaml", "a: " + std::string(40, '[') + "!include inner.yaml" + std::string(40, ']') + "\n");
  e = parse_error({f});
  CHECK_MESSAGE(contains(e, "nested more than 64 levels deep counting across !include"), e);
  // a command-line value counts its dotted key
  e = parse_error({"--data.tags", std::string(70, '[') + std::string(70, ']')});
  CHECK_MESSAGE(contains(e, "command line (--data.tags)"), e);
}

TEST_CASE("include: only regular files of at most 16 MiB, and the including file is named") {
  temp_dir d("include_files");
  fs::create_directories(d.path / "adir");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/dev/zero", "is not a regular file"},
      {"/dev/urandom", "is not a regular file"},
      {"/dev/null", "is not a regular file"},
      {"adir", "is a directory"},
      {"''", "!include takes the path of a YAML file"},
      {"", "!include takes the path of a YAML file"},
      {"zero_link.yaml", "is not a regular file"},
      {"huge.yaml", "bytes; the limit is 16 MiB per file"},
  };
  fs::create_symlink("/dev/zero", d.path / "zero_link.yaml");
  {
    std::ofstream(d.path / "huge.yaml") << "a: b\n";
    fs::resize_file(d.path / "huge.yaml", (std::uintmax_t(16) << 20) + 1);  // sparse
  }
  for (const auto& c : cases) {
    const std::string& target = c.first;  // not a structured binding: CHECK_MESSAGE's lambda captures it (clang < 16)
    const std::string& expected = c.second;
    std::string f = d.write("main.yaml", "trainer:\n  seed: 1\ndata: !include " + target + "\n");
    std::string e = parse_error({f});
    CHECK_MESSAGE(contains(e, expected), target << " -> " << e);
    CHECK_MESSAGE(contains(e, f + ":3"), target << " -> " << e);  // the including file and line
  }
  // the main config file
  CHECK(contains(parse_error({"--config_path", "/dev/zero"}), "config file '/dev/zero' is not a regular file"));
  CHECK(contains(parse_error({"/dev/urandom"}), "is not a regular file"));
  CHECK(contains(parse_error({"--config_path", d.path.string()}), "is a directory, not a YAML file"));
  CHECK(contains(parse_error({"--config_path", (d.path / "zero_link.yaml").string()}), "is not a regular file"));
  CHECK(contains(parse_error({"--config_path", (d.path / "huge.yaml").string()}),
                 "is 16,777,217 bytes; the limit is 16 MiB per file"));
  CHECK(contains(parse_error({"--config_path=", "--dry_run"}), "the config file path is empty"));
  // a symlink to a regular file is fine
  std::string real = d.write("real.yaml", "seed: 3\n");
  fs::create_symlink(real, d.path / "link.yaml");
  std::string f = d.write("main.yaml", "trainer: !include link.yaml\n");
  CHECK(parse({f}).config.trainer.seed == 3);
  // a chain of more than 16 includes
  for (int i = 0; i < 20; ++i) d.write("c" + std::to_string(i) + ".yaml", "!include c" + std::to_string(i + 1) + ".yaml\n");
  d.write("c20.yaml", "seed: 1\n");
  CHECK(contains(parse_error({(d.path / "c0.yaml").string()}), "includes nested more than 16 files deep"));
  // include files repeated through aliases add up: at most 64 MiB read in all
  std::string big = d.write("big.yaml", "x: \"" + std::string(15 << 20, 'a') + "\"\n");
  std::string text = "a: &x !include big.yaml\nb: [*x, *x, *x, *x, *x, *x]\n";
  std::string e = parse_error({d.write("many.yaml", text)});
  CHECK_MESSAGE((contains(e, "more than 64 MiB") || contains(e, "64 MiB")), e);
}

TEST_CASE("ranges: every numeric key is checked to a finite, meaningful range with the range in the message") {
  struct bad {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<bad> cases = {
      // floats: infinity and NaN are refused where they are read
      {{"--optimizer.learning_rate", "inf"}, "optimizer.learning_rate (command line): expected a finite number, got .inf"},
      {{"--optimizer.learning_rate", ".nan"}, "expected a finite number, got .nan"},
      {{"--optimizer.weight_decay", "inf"}, "optimizer.weight_decay (command line): expected a finite number"},
      {{"--optimizer.warmup", "inf"}, "optimizer.warmup (command line): expected a finite number"},
      {{"--z_loss_weight", "inf"}, "z_loss_weight (command line): expected a finite number"},
      {{"--optimizer.cycles", "-.inf"}, "optimizer.cycles (command line): expected a finite number"},
      {{"--model", "{type: llama, hidden_dim: 32, num_heads: 4, num_kv_heads: 4, rope: {type: llama3, theta: .inf}}"},
       "model.rope.theta (command line): expected a finite number"},
      // and the ranges
      {{"--optimizer.learning_rate", "1e300"}, "optimizer.learning_rate (command line): must be a finite number in [0.0, 100.0]"},
      {{"--optimizer.weight_decay", "1000"}, "optimizer.weight_decay (command line): must be a finite number in [0.0, 100.0]"},
      {{"--optimizer.warmup", "1e20"}, "optimizer.warmup (command line): must be a finite number in [0.0, 1099511627776.0]"},
      {{"--optimizer.decay", "-1"}, "optimizer.decay"},
      {{"--optimizer.rewarmup", "1e13"}, "optimizer.rewarmup"},
      {{"--optimizer.epsilon", "2"}, "optimizer.epsilon (command line): must be a finite number in (0.0, 1.0]"},
      {{"--optimizer.max_grad_norm", "1e30"}, "optimizer.max_grad_norm"},
      {{"--optimizer.cycle_length", "0"}, "optimizer.cycle_length"},
      {{"--optimizer.cycles", "[100, 50]"}, "optimizer.cycles[1] (command line): cycle boundaries must increase"},
      {{"--optimizer.cycles", "[0]"}, "optimizer.cycles[0]"},
      {{"--optimizer.lr_schedule", "{type: cosine, exponent: 0}"}, "optimizer.lr_schedule.exponent"},
      {{"--optimizer.lr_schedule", "{type: inv_sqrt, timescale: 1e20}"}, "optimizer.lr_schedule.timescale"},
      {{"--optimizer.lr_schedule", "{type: power, batch_size: 0, seq_length: 1}"}, "optimizer.lr_schedule.batch_size"},
      {{"--optimizer.lr_schedule", "{type: power, batch_size: 1, seq_length: 1, b: 0.5}"}, "optimizer.lr_schedule.b"},
      {{"--optimizer.skip_bad_steps", "{rolling_interval_length: 0}"}, "optimizer.skip_bad_steps.rolling_interval_length"},
      {{"--optimizer.skip_bad_steps", "{sigma_factor: -1}"}, "optimizer.skip_bad_steps.sigma_factor"},
      {{"--optimizer.clip_update_norm", "{sigma_factor: 0}"}, "optimizer.clip_update_norm.sigma_factor"},
      {{"--optimizer.update_rms_clipping", "0"}, "optimizer.update_rms_clipping"},
      // model sizes
      {{"--model.num_layers", "2147483647"}, "model.num_layers (command line): must be an integer in [1, 4096] (got 2147483647)"},
      {{"--model.hidden_dim", "1048576", "--model.num_heads", "4"}, "model.hidden_dim (command line): must be an integer in [1, 2^17 = 131072]"},
      {{"--model.seq_len", "16777216"}, "model.seq_len (command line): must be an integer in [2, 2^20 = 1048576]"},
      {{"--model.num_heads", "8192"}, "model.num_heads"},
      {{"--model.mlp_scale", "1000000"}, "model.mlp_scale"},
      {{"--model.layer_norm_epsilon", "2"}, "model.layer_norm_epsilon"},
      {{"--model.initializer_range", "1e9"}, "model.initializer_range"},
      {{"--model.cross_entropy_block_size", "0"}, "model.cross_entropy_block_size"},
      {{"--model", "{type: llama, intermediate_dim: 2000000, hidden_dim: 32, num_heads: 4, num_kv_heads: 4}"}, "model.intermediate_dim"},
      {{"--model", "{type: llama, hidden_dim: 32, num_heads: 4, num_kv_heads: 4, head_dim: 1000000}"}, "model.head_dim"},
      {{"--model", "{type: llama, hidden_dim: 32, num_heads: 4, num_kv_heads: 4, sliding_window: 0}"}, "model.sliding_window"},
      {{"--model", "{type: llama, hidden_dim: 32, num_heads: 4, num_kv_heads: 4, max_window_layers: 100000}"}, "model.max_window_layers"},
      {{"--model", "{type: llama, hidden_dim: 32, num_heads: 4, num_kv_heads: 4, rope: {type: yarn, original_max_position_embeddings: 0}}"}, "model.rope.original_max_position_embeddings"},
      // trainer
      {{"--trainer.train_batch_size", "0x7fffffff"}, "trainer.train_batch_size (command line): must be an integer in [1, 2^20 = 1048576] (got 2147483647)"},
      {{"--trainer.train_batch_size", "[{start: 0, value: 8}, {start: 10, value: 99999999}]"}, "trainer.train_batch_size[1].value"},
      {{"--trainer.max_eval_batches", "0"}, "trainer.max_eval_batches (command line): must be an integer in [1, 2^40 = 1099511627776] (got 0); or null"},
      {{"--trainer.num_train_steps", "9223372036854775807"}, "trainer.num_train_steps"},
      {{"--trainer.num_train_steps", "1099511627776", "--trainer.train_batch_size", "2"}, "sequences (train_batch_size x num_train_steps); the limit is 2^40"},
      {{"--trainer.steps_per_eval", "1e15"}, "trainer.steps_per_eval"},
      {{"--trainer.per_device_parallelism", "2097152"}, "trainer.per_device_parallelism"},
      {{"--trainer.per_device_eval_parallelism", "2097152"}, "trainer.per_device_eval_parallelism"},
      {{"--trainer.profiler_start_step", "-1"}, "trainer.profiler_start_step"},
      {{"--trainer.profiler_num_steps", "0"}, "trainer.profiler_num_steps"},
      {{"--trainer.watch.interval", "1e15"}, "trainer.watch.interval"},
      {{"--trainer.checkpointer.keep", "[{every: 10, until: 1e15}]"}, "trainer.checkpointer.keep[0].until"},
      {{"--trainer.checkpointer.keep", "[{every: 1e15}]"}, "trainer.checkpointer.keep[0].every"},
      {{"--trainer.checkpointer.save_interval", "1e300"}, "trainer.checkpointer.save_interval (command line): a duration must be at most 3650d"},
      {{"--trainer.checkpointer.save_interval", "inf:0"}, "expected a finite duration"},
      {{"--trainer.checkpointer.save_interval", "99999999999d"}, "at most 3650d"},
      {{"--trainer.tracker", "{type: tensorboard, max_queue: 0}"}, "trainer.tracker.max_queue"},
      {{"--trainer.tracker", "{type: tensorboard, flush_secs: -5}"}, "trainer.tracker.flush_secs"},
      {{"--trainer.tracker", "{type: tensorboard, purge_step: -5}"}, "trainer.tracker.purge_step"},
      // data
      {{"--data.tokenizer", "passthrough", "--data.vocab_size", "0x7fffffff"}, "data.vocab_size (command line): must be an integer in [1, 2^22 = 4194304]"},
      {{"--data.ignore_token_id", "4294967296"}, "data.ignore_token_id"},
      {{"--data.shuffle", "0"}, "data.shuffle"},
      {{"--data.cache_options", "{batch_size: 0}"}, "data.cache_options.batch_size"},
      {{"--data.cache_options", "{num_threads: 100000}"}, "data.cache_options.num_threads"},
      {{"--data.cache_options", "{num_shard_groups: 0}"}, "data.cache_options.num_shard_groups"},
      {{"--data.cache_options", "{target_size_per_flush: 99999999999999999999GB}"}, "data.cache_options.target_size_per_flush"},
  };
  temp_dir d("ranges");
  std::string f = d.write("v.yaml", kGood);
  for (const auto& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.begin(), f);
    std::string p = problems(args);
    CHECK_MESSAGE(contains(p, c.expected), c.args[0] << " " << c.args[1] << " -> " << p);
  }
  // the extremes that are allowed
  std::string p = problems({f, "--model.num_layers", "4096", "--trainer.train_batch_size", "0x10",
                            "--optimizer.learning_rate", "100", "--trainer.max_eval_batches", "1",
                            "--trainer.checkpointer.save_interval", "3650d", "--trainer.seed", "-9223372036854775808"});
  CHECK_MESSAGE(p.empty(), p);
  CHECK(parse({f, "--trainer.train_batch_size", "0x10"}).config.trainer.train_batch_size.at(0) == 16);
}

TEST_CASE("run ids and dataset names are safe path components") {
  temp_dir d("run_ids");
  std::string f = d.write("v.yaml", kGood);
  for (const std::string bad : {"../escape", "/abs", "a/b", "..", ".hidden", "''", "a b", "x\\\\y", "\"\\u00e9\""}) {
    std::string p = problems({f, "--trainer.id", bad});
    CHECK_MESSAGE(contains(p, "trainer.id (command line): the run id '"), bad << " -> " << p);
    CHECK_MESSAGE(contains(p, "must be 1 to 128 letters, digits, '-', '_' or '.', not starting with '.'"), p);
  }
  CHECK(contains(problems({f, "--trainer.id", std::string(129, 'a')}), "is 129 characters long"));
  for (const std::string& good : std::vector<std::string>{"run-1", "abc123", "My_Run.v2", std::string(128, 'z')})
    CHECK_MESSAGE(problems({f, "--trainer.id", good}).empty(), good);
  for (const std::string bad : {"../x", "a/../b", "/abs", "a//b", "a/", ".cache", "a b"}) {
    std::string p = problems({f, "--data.train_urls", "[]", "--data.configs", "{\"" + bad + "\": {train_urls: [a.jsonl]}}"});
    CHECK_MESSAGE(contains(p, "data.configs." + bad + " (command line): the dataset name '" + bad + "' names cache"), p);
  }
  // upstream's nested names are fine
  CHECK(!contains(problems({f, "--data.train_urls", "[]", "--data.configs", "{paloma/4chan: {train_urls: [a.jsonl]}}"}),
                  "data.configs.paloma/4chan"));
  CHECK(contains(problems({f, "--trainer.log_dir", "''"}), "trainer.log_dir"));
  // control characters and invalid UTF-8 in strings cannot be written back into config.yaml
  CHECK(contains(problems({f, "--trainer.log_dir", "\"a\\x01b\""}), "control character 1"));
  CHECK(contains(problems({f, "--trainer.log_dir", "a\xff"}), "not valid UTF-8"));
}

TEST_CASE("round trip: the resolved config.yaml re-loads to the same config and the same text") {
  temp_dir d("round_trip");
  std::vector<std::vector<std::string>> runs;
  for (const auto& e : fs::directory_iterator(LEVANTER_SOURCE_DIR "/config"))
    if (e.path().extension() == ".yaml") runs.push_back({e.path().string()});
  REQUIRE(runs.size() >= 5);
  const std::string good = d.write("good.yaml", kGood);
  runs.push_back({good, "--trainer.checkpointer.save_interval", "3650d"});
  runs.push_back({good, "--trainer.checkpointer.save_interval", "1e-300"});
  runs.push_back({good, "--trainer.checkpointer.save_interval", "61.1s"});
  runs.push_back({good, "--trainer.checkpointer.save_interval", "1:30:00.25"});
  runs.push_back({good, "--trainer.checkpointer.save_interval", "0.1"});
  runs.push_back({good, "--trainer.checkpointer.save_interval", "1h0.000001s"});
  runs.push_back({good, "--optimizer.learning_rate", "1e-300", "--optimizer.weight_decay", "99.99999999999999",
                  "--optimizer.min_lr_ratio", "0.30000000000000004", "--z_loss_weight", "5e-324"});
  runs.push_back({good, "--trainer.seed", "-9223372036854775808", "--trainer.train_batch_size", "0x100000",
                  "--trainer.num_train_steps", "1048576", "--model.num_layers", "4096"});
  runs.push_back({good, "--trainer.id", std::string(128, 'r'), "--data.tags",
                  "[yes, 'no', 'null', '~', '0x10', '1e3', '.inf', '- a', '#x', 'a: b', \"'\", '\"', ' sp ', "
                  "\"a\\nb\", \"tab\\tx\", 'h\u00e9llo \u2603', '', '[x]', '{y}', '&a', '*b', '!t', '%p', '@q', '`r']"});
  runs.push_back({good, "--data.train_urls", "['{a,b}.jsonl', 'c?.jsonl']", "--trainer.tracker",
                  "[{type: json_logger, logger_name: 'on'}, {type: tensorboard, logdir: 'off'}]"});
  runs.push_back({good, "--data.configs", "{a: {train_urls: [x.jsonl]}, b: {train_urls: [y.jsonl]}}",
                  "--data.train_weights", "{a: 0.5, b: 0.5}", "--data.train_urls", "[]"});
  for (const auto& args : runs) {
    std::string label;
    for (const auto& a : args) label += a + " ";
    auto first = parse(args);
    std::string f = d.write("resolved.yaml", first.resolved_yaml);
    std::string e = error_of([&] {
      auto second = parse({f});
      CHECK_MESSAGE(second.resolved_yaml == first.resolved_yaml, label);
      auto v1 = levanter::validate_train_lm(first.config, first.sources);
      auto v2 = levanter::validate_train_lm(second.config, second.sources);
      CHECK_MESSAGE(v1.errors.size() == v2.errors.size(), label << joined(v2.errors));
    });
    CHECK_MESSAGE(e == "<no error>", label << " -> " << e << "\n" << first.resolved_yaml);
  }
}
