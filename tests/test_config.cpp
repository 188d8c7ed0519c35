// Tests of levanter/config: YAML decode/encode of every config type, !include, the command line (overrides,
// --help, --dry_run), error messages (key path, file:line, nearest key) and validate().
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
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
  CHECK(std::isinf(dec<double>(".inf")));
  CHECK(dec<double>("-.inf") < 0);
  CHECK(std::isnan(dec<double>(".nan")));
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
  e = error_of([] { dec<OptimizerChoice>("{type: lion, beta1: 0.9}"); });
  CHECK(contains(e, "x.type (<yaml>:1): lion is not supported yet; use type: adam"));
  e = error_of([] { dec<ModelChoice>("mixtral"); });
  CHECK(contains(e, "mixtral is not supported yet; use type: mistral (dense) or llama"));
  CHECK(dec<ModelChoice>("llama").type_name() == "llama");
  CHECK(dec<ModelChoice>("{type: qwen, use_sliding_window: true, sliding_window: 8}").get_if<QwenConfig>()->family ==
        llama_family::qwen2);
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
      {{"--data.stop_strategy", "first_exhausted"}, "stop_strategy 'first_exhausted' is not implemented"},
      {{"--data.target_budget", "1000"}, "data.target_budget"},
      {{"--data.bad_documents", "ignore"}, "unknown policy 'ignore': use stop or skip"},
      {{"--data.cache_options", "{target_size_per_flush: lots}"}, "'lots' is not a size"},
      {{"--viz.every", "-1"}, "viz.every"},
      {{"--data.format", "{type: chat}"}, "format 'chat' is not supported yet"},
      {{"--data.tokenizer", "meta-llama/Llama-2-7b-hf"}, "pass a local tokenizer.json path, or use tokenizer: byte"},
      {{"--data.tokenizer", "gpt2"}, "Hugging Face hub tokenizers need a download"},
      {{"--trainer.tracker", "{type: wandb}"}, "trainer.tracker (command line): the wandb tracker needs the Weights & Biases service"},
      {{"--trainer.tracker", "[{type: json_logger}, {type: tensorboard, logdir: \"gs://b/tb\"}]"}, "'gs://b/tb' is a remote URL"},
      {{"--trainer.tracker", "{type: wandb}"}, "use tracker: {type: tensorboard}"},
      {{"--trainer.wandb", "{project: x}"}, "trainer.wandb"},
      {{"--trainer.quantization", "{fp8: true}"}, "trainer.quantization"},
      {{"--trainer.model_averaging", "{type: ema}"}, "trainer.model_averaging"},
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
      {{"--epoch", "2"}, "epoch (command line): epoch-bounded training"},
      {{"--trainer.mp", "p=f32,c=f16"}, "trainer.mp (command line): float16"},
      {{"--optimizer.cooldown", "0.1"}, "optimizer.cooldown (command line): cooldown is deprecated upstream"},
      {{"--optimizer.haps", "[10]"}, "use cycles"},
      {{"--model.attn_backend", "splash"}, "model.attn_backend"},
      {{"--data.permutation_type", "random"}, "use linear or feistel"},
      {{"--trainer.model_axis_size", "2"}, "trainer.model_axis_size (command line): tensor parallelism"},
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
