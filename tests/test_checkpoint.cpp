// Checkpoints (levanter/checkpoint/): HDF5 round trips with axis names, atomic commits, discovery of the newest
// complete checkpoint, torn-checkpoint fallback, partial loads, upstream's step/time policies with an injected
// clock and the deletion rules for temporary checkpoints.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <levanter/checkpoint/train_state.hpp>
#include <levanter/models/gpt2.hpp>

namespace fs = std::filesystem;
namespace ck = levanter::checkpoint;
using levanter::gpt2::LMHeadModel;

namespace {

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("levanter_test_checkpoint_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

levanter::Gpt2Config tiny() {
  levanter::Gpt2Config c;
  c.seq_len = 8;
  c.hidden_dim = 16;
  c.num_heads = 2;
  c.num_layers = 2;
  return c;
}

LMHeadModel model(std::uint64_t seed) { return LMHeadModel::init(tiny(), 11, haliax::random::make_key(seed)); }

/// Every leaf's values, in traversal order.
std::vector<std::vector<float>> values(const LMHeadModel& m) {
  std::vector<std::vector<float>> out;
  haliax::tree::for_each_leaf(m, [&](const std::string&, const auto& leaf) { out.push_back(leaf.to_host()); });
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Flips one bit in the middle of file `p` (its size unchanged).
void flip_middle_byte(const fs::path& p) {
  std::string bytes = slurp(p);
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

/// resume_newest under `base` into a fresh model: the step it loaded, the model and the log lines.
struct resumed {
  ck::resume_outcome outcome;
  std::int64_t step = -1;
  LMHeadModel model;
  std::vector<std::string> log;
};
resumed resume(const fs::path& base) {
  resumed r{ck::resume_outcome::none_found, -1, model(3), {}};
  auto load = [&](const ck::checkpoint_info& c) {
    r.step = ck::load_train_state<LMHeadModel>(c, r.model, nullptr, false).step;
  };
  r.outcome = ck::resume_newest(base, load, [&](const std::string& s) { r.log.push_back(s); });
  return r;
}

/// Writes a committed checkpoint of `m` at `step` under `base` with a given timestamp.
fs::path save(const fs::path& base, const LMHeadModel& m, std::int64_t step, bool temporary,
              std::chrono::system_clock::time_point when = std::chrono::system_clock::now()) {
  const auto dir = base / ("step-" + std::to_string(step));
  ck::write_checkpoint(dir, ck::train_state_files<LMHeadModel>(m, nullptr, step, haliax::random::make_key(5), 0, ""),
                       step, temporary, when);
  return dir;
}

}  // namespace

TEST_CASE("checkpoint: HDF5 round trip keeps values, shapes and axis names") {
  auto dir = temp_dir("roundtrip");
  const auto a = model(1);
  ck::snapshot s;
  s.add_tree("", a);
  s.add_scalar("step", std::int64_t{42});
  s.add_vector("key", std::vector<std::uint32_t>{7u, 9u});
  s.write((dir / "m.h5").string());

  ck::reader r((dir / "m.h5").string());
  CHECK(r.scalar<std::int64_t>("step") == 42);
  CHECK(r.vector<std::uint32_t>("key") == std::vector<std::uint32_t>{7u, 9u});
  CHECK(r.has("transformer.blocks.stacked.attn.c_attn.weight"));
  CHECK_FALSE(r.has("transformer.blocks.stacked.attn.nothing"));
  CHECK(r.axes("transformer.blocks.stacked.attn.c_attn.weight") ==
        std::vector<std::string>{"layers", "embed", "qkv", "heads", "head_size"});
  CHECK(r.dims("embeddings.token_embeddings.weight") == std::vector<std::int64_t>{11, 16});
  auto b = model(2);
  REQUIRE(values(b) != values(a));
  r.read_tree("", b);
  CHECK(values(b) == values(a));

  // The same state written twice gives the same bytes (no timestamps in the file).
  s.write((dir / "m2.h5").string());
  CHECK(slurp(dir / "m.h5") == slurp(dir / "m2.h5"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: a different model size or axis layout is refused with both shapes") {
  auto dir = temp_dir("mismatch");
  ck::snapshot s;
  s.add_tree("", model(1));
  s.write((dir / "m.h5").string());
  auto c = tiny();
  c.hidden_dim = 32;
  auto bigger = LMHeadModel::init(c, 11, haliax::random::make_key(0));
  ck::reader r((dir / "m.h5").string());
  CHECK_THROWS_WITH_AS(r.read_tree("", bigger), doctest::Contains("has shape [2, 16] but the model expects [2, 32]"),
                       ck::error);
  // Same sizes, different axes: stored {layers, embed} read as an array of {layers, mlp}.
  auto wrong = haliax::zeros<float>(2 * levanter::Layers, 16 * levanter::Mlp);
  CHECK_THROWS_WITH_AS(r.read_into("transformer.blocks.stacked.ln_1.weight", wrong),
                       doctest::Contains("has axes [layers, embed] but the model expects [layers, mlp]"), ck::error);
  CHECK_THROWS_WITH_AS(ck::reader((dir / "absent.h5").string()), doctest::Contains("absent.h5"), ck::error);
  std::ofstream(dir / "junk.h5") << "not hdf5";
  CHECK_THROWS_WITH_AS(ck::reader((dir / "junk.h5").string()), doctest::Contains("not an HDF5 file"), ck::error);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: missing leaves fail unless a partial load is allowed") {
  auto dir = temp_dir("partial");
  const auto a = model(1);
  ck::snapshot s;
  haliax::tree::for_each_leaf(a, [&](const std::string& name, const auto& leaf) {
    if (name != "transformer.ln_f.bias") s.add(name, leaf);
  });
  s.write((dir / "m.h5").string());
  ck::reader r((dir / "m.h5").string());
  auto b = model(2);
  CHECK_THROWS_WITH_AS(r.read_tree("", b), doctest::Contains("allow_partial_checkpoint"), ck::error);
  auto c = model(2);
  const auto before = c.transformer.ln_f.bias->to_host();
  const auto missing = r.read_tree("", c, true);
  CHECK(missing == std::vector<std::string>{"transformer.ln_f.bias"});
  CHECK(c.transformer.ln_f.bias->to_host() == before);
  CHECK(c.transformer.ln_f.weight->to_host() == a.transformer.ln_f.weight->to_host());
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: commits are atomic and discovery picks the newest complete one") {
  auto base = temp_dir("discover");
  const auto t0 = std::chrono::system_clock::now();
  save(base, model(1), 10, false, t0);
  save(base, model(2), 20, true, t0 + std::chrono::seconds(5));
  // A write that never committed: a hidden temporary directory, and a step directory without metadata.json.
  fs::create_directories(base / ".step-30.tmp-123");
  std::ofstream(base / ".step-30.tmp-123" / "metadata.json") << R"({"step": 30, "timestamp": "9999"})";
  fs::create_directories(base / "step-40");
  std::ofstream(base / "step-40" / "model.h5") << "partial";
  auto found = ck::discover(base);
  REQUIRE(found.checkpoints.size() == 2);
  // The step directory without metadata.json is reported (damaged), the hidden unfinished write is not.
  CHECK(found.incomplete == std::vector<std::string>{(base / "step-40").string()});
  CHECK(found.checkpoints[0].step == 20);
  CHECK(found.checkpoints[0].is_temporary);
  CHECK(found.checkpoints[1].step == 10);
  CHECK(found.checkpoints[0].metadata["files"].contains("model.h5"));
  // The path of a checkpoint itself also works.
  CHECK(ck::discover(base / "step-10").checkpoints.at(0).step == 10);
  CHECK(ck::discover(base / "nothing-here").checkpoints.empty());
  // A corrupt metadata.json is reported, not taken for "no checkpoint".
  fs::create_directories(base / "step-50");
  std::ofstream(base / "step-50" / "metadata.json") << "{ not json";
  found = ck::discover(base);
  CHECK(found.checkpoints.size() == 2);
  REQUIRE(found.problems.size() == 1);
  CHECK(found.problems[0].find("step-50/metadata.json' is corrupt") != std::string::npos);
  // Hostile metadata (fuzzer findings): deep nesting, a step too large for an integer, a negative size.
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {std::string(100000, '[') + std::string(100000, ']'), "nested deeper than 16 levels"},
           {R"({"step": 1e300, "timestamp": "x"})", "'step' is not a non-negative integer"},
           {R"({"step": 18446744073709551615})", "'step' is not a non-negative integer"},
           {R"({"step": 3, "files": {"model.h5": -4}})", "'files.model.h5' has the wrong type"},
           {R"({"step": 3, "files": {"../x": 4}})", "invalid file '../x'"}}) {
    std::ofstream(base / "step-50" / "metadata.json", std::ios::trunc) << text;
    found = ck::discover(base);
    REQUIRE(found.problems.size() == 1);
    CHECK(found.problems[0].find(why) != std::string::npos);
  }
  fs::remove_all(base);
}

TEST_CASE("checkpoint: a torn newest checkpoint falls back to the previous one, never to step 0") {
  auto base = temp_dir("torn");
  const auto t0 = std::chrono::system_clock::now();
  const auto a = model(1), b = model(2);
  save(base, a, 10, false, t0);
  const auto newest = save(base, b, 20, false, t0 + std::chrono::seconds(1));
  fs::resize_file(newest / "model.h5", fs::file_size(newest / "model.h5") / 2);

  std::vector<std::string> log;
  auto m = model(3);
  std::int64_t step = -1;
  auto load = [&](const ck::checkpoint_info& c) { step = ck::load_train_state<LMHeadModel>(c, m, nullptr, false).step; };
  auto outcome = ck::resume_newest(base, load, [&](const std::string& s) { log.push_back(s); });
  CHECK(outcome == ck::resume_outcome::loaded);
  CHECK(step == 10);
  CHECK(values(m) == values(a));
  REQUIRE(log.size() == 1);
  CHECK(log[0].find("step-20") != std::string::npos);
  CHECK(log[0].find("torn") != std::string::npos);

  // Every checkpoint unreadable: an error listing them, not a fresh start.
  fs::resize_file(base / "step-10" / "model.h5", 100);
  CHECK_THROWS_WITH_AS(ck::resume_newest(base, load, [](const std::string&) {}),
                       doctest::Contains("found 2 checkpoint(s)"), ck::error);
  // A file replaced by garbage of the same size is caught by HDF5 itself.
  fs::remove_all(base);
  save(base, a, 10, false, t0);
  const auto size = fs::file_size(base / "step-10" / "model.h5");
  std::ofstream(base / "step-10" / "model.h5", std::ios::trunc) << std::string(size, 'x');
  CHECK_THROWS_WITH_AS(ck::resume_newest(base, load, [](const std::string&) {}), doctest::Contains("model.h5"), ck::error);
  // Nothing at all: none_found.
  CHECK(ck::resume_newest(base / "empty", load, [](const std::string&) {}) == ck::resume_outcome::none_found);
  fs::remove_all(base);
}

TEST_CASE("checkpoint: training state round trip with the AdamW state") {
  auto dir = temp_dir("state");
  auto m = model(1);
  levanter::AdamConfig oc;
  oc.learning_rate = 1e-2;
  levanter::optim::adamw_optimizer<LMHeadModel> opt(oc, 10, m);
  auto grads = haliax::tree::map(m, [](const std::string&, const auto& x) { return x * 0.5f; });
  opt.update(m, grads, 1.0);
  opt.update(m, grads, 0.9);
  const auto key = haliax::random::make_key(77);
  ck::write_checkpoint(dir / "step-2", ck::train_state_files<LMHeadModel>(m, &opt, 2, key, 8, "model: {}\n"), 2, false,
                       std::chrono::system_clock::now());
  CHECK(slurp(dir / "step-2" / "config.yaml") == "model: {}\n");

  auto m2 = model(9);
  levanter::optim::adamw_optimizer<LMHeadModel> opt2(oc, 10, m2);
  const auto info = *ck::read_metadata(dir / "step-2");
  auto loaded = ck::load_train_state<LMHeadModel>(info, m2, &opt2, false);
  CHECK(loaded.step == 2);
  CHECK(loaded.had_opt_state);
  REQUIRE(loaded.training_key.has_value());
  CHECK(*loaded.training_key == key);
  CHECK(values(m2) == values(m));
  CHECK(values(opt2.state().mu) == values(opt.state().mu));
  CHECK(values(opt2.state().nu) == values(opt.state().nu));
  CHECK(opt2.state().count == 2);
  CHECK(opt2.state().adam_count == 2);
  // Continuing from the loaded state is bitwise continuing the original.
  opt.update(m, grads, 0.8);
  opt2.update(m2, grads, 0.8);
  CHECK(values(m2) == values(m));
  fs::remove_all(dir);
}

TEST_CASE("checkpointer: step policies, time policy and deletion of temporary checkpoints (injected clock)") {
  auto base = temp_dir("policy");
  auto now = std::chrono::system_clock::time_point{} + std::chrono::hours(1000);
  ck::policy p;
  p.base_path = base;
  p.save_interval = std::chrono::seconds(30);
  p.keep = {levanter::KeepPolicy{5, 10}, levanter::KeepPolicy{20, std::nullopt}};
  std::vector<std::string> log;
  // An unfinished write of a dead process is cleaned up; one of a live process (ours) is left alone.
  fs::create_directories(base / ".step-7.tmp-999999999" / "x");
  const auto mine = base / (".step-8.tmp-" + std::to_string(::getpid()));
  fs::create_directories(mine);
  auto first = std::make_unique<ck::checkpointer>(p, [&] { return now; }, [&](const std::string& s) { log.push_back(s); });
  auto& c = *first;
  CHECK_FALSE(fs::exists(base / ".step-7.tmp-999999999"));
  CHECK(fs::exists(mine));
  fs::remove_all(mine);
  CHECK(c.step_interval(3) == 5);
  CHECK(c.step_interval(10) == 5);
  CHECK(c.step_interval(11) == 20);
  const auto m = model(1);
  auto files = [&](std::int64_t step) {
    return [&m, step] { return ck::train_state_files<LMHeadModel>(m, nullptr, step, {}, 0, ""); };
  };
  std::vector<std::int64_t> saved;
  for (std::int64_t step = 0; step <= 45; ++step) {
    now += std::chrono::seconds(7);  // one step takes 7 s
    if (c.on_step(step, files(step))) saved.push_back(step);
    c.wait();
  }
  // Permanent at 5, 10 (every 5 until 10), then 20, 40; temporary when 30 s passed since the last save.
  CHECK(saved == std::vector<std::int64_t>{5, 10, 15, 20, 25, 30, 35, 40, 45});
  auto on_disk = [&] {
    std::vector<std::int64_t> steps;
    for (const auto& cpt : ck::discover(base).checkpoints) steps.push_back(cpt.step);
    std::sort(steps.begin(), steps.end());
    return steps;
  };
  // Temporary ones (15, 25, 30, 35) were deleted once the next one committed; 45 is the latest temporary.
  CHECK(on_disk() == std::vector<std::int64_t>{5, 10, 20, 40, 45});
  CHECK(ck::read_metadata(base / "step-45")->is_temporary);
  CHECK_FALSE(ck::read_metadata(base / "step-40")->is_temporary);

  // A temporary checkpoint promoted to permanent (its metadata edited) is not deleted.
  {
    auto meta = ck::read_metadata(base / "step-45")->metadata;
    meta["is_temporary"] = false;
    std::ofstream(base / "step-45" / "metadata.json") << meta.dump();
  }
  now += std::chrono::seconds(31);
  CHECK(c.on_step(46, files(46)));
  c.wait();
  CHECK(on_disk() == std::vector<std::int64_t>{5, 10, 20, 40, 45, 46});
  // A forced save (end of training) is permanent, and a second force at the same step does nothing.
  CHECK(c.on_step(47, files(47), true));
  c.wait();
  CHECK_FALSE(c.on_step(47, files(47), true));
  CHECK_FALSE(ck::read_metadata(base / "step-47")->is_temporary);
  CHECK(on_disk() == std::vector<std::int64_t>{5, 10, 20, 40, 45, 47});  // 46 was temporary

  // A new checkpointer over the same directory (a resumed run) adopts the newest temporary checkpoint and
  // deletes it after its own first save.
  now += std::chrono::seconds(1);
  c.save_now(48, files(48)(), true);
  c.wait();
  first.reset();  // the first run ends (its lock on the directory with it)
  ck::checkpointer resumed(p, [&] { return now; });
  now += std::chrono::seconds(31);
  CHECK(resumed.on_step(49, files(49)));
  resumed.wait();
  CHECK(on_disk() == std::vector<std::int64_t>{5, 10, 20, 40, 45, 47, 49});
  // Nothing at step 0 unless forced.
  CHECK_FALSE(resumed.on_step(0, files(0)));
  fs::remove_all(base);
}

TEST_CASE("checkpointer: keep policies must be ordered, and write failures surface") {
  ck::policy p;
  p.base_path = temp_dir("bad");
  p.keep = {levanter::KeepPolicy{5, std::nullopt}, levanter::KeepPolicy{10, 20}};
  CHECK_THROWS_WITH_AS(ck::checkpointer{p}, doctest::Contains("only the last policy may omit 'until'"), ck::error);
  p.keep = {levanter::KeepPolicy{5, 20}, levanter::KeepPolicy{10, 10}};
  CHECK_THROWS_WITH_AS(ck::checkpointer{p}, doctest::Contains("sorted by increasing 'until'"), ck::error);
  // A base path that is a file: refused when the checkpointer locks it, naming the path.
  std::ofstream(p.base_path / "file") << "x";
  p.base_path = p.base_path / "file";
  p.keep = {levanter::KeepPolicy{1, std::nullopt}};
  CHECK_THROWS_WITH_AS(ck::checkpointer{p}, doctest::Contains(p.base_path.string().c_str()), ck::error);
  // A background write that fails (no file may grow: RLIMIT_FSIZE 0) is reported by the next call.
  p.base_path = p.base_path.parent_path() / "run";
  ck::checkpointer c(p);
  const auto m = model(1);
  struct sigaction ignore {}, old {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGXFSZ, &ignore, &old);
  rlimit saved{};
  ::getrlimit(RLIMIT_FSIZE, &saved);
  rlimit none = saved;
  none.rlim_cur = 0;
  ::setrlimit(RLIMIT_FSIZE, &none);
  const bool started = c.on_step(1, [&] { return ck::train_state_files<LMHeadModel>(m, nullptr, 1, {}, 0, ""); });
  CHECK(started);
  CHECK_THROWS_WITH_AS(c.wait(), doctest::Contains(p.base_path.string().c_str()), ck::error);
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::sigaction(SIGXFSZ, &old, nullptr);
  fs::remove_all(p.base_path.parent_path());
}

TEST_CASE("checkpoint: a changed byte anywhere in a checkpoint's files is detected on load, by its checksum") {
  auto base = temp_dir("flip");
  const auto t0 = std::chrono::system_clock::now();
  const auto a = model(1), b = model(2);
  save(base, a, 10, false, t0);
  const auto newest = save(base, b, 20, false, t0 + std::chrono::seconds(1));
  const auto info = ck::read_metadata(newest).value();
  CHECK(info.metadata["format_version"] == 2);
  REQUIRE(info.metadata["checksums"].size() == info.metadata["files"].size());
  CHECK_NOTHROW(ck::verify_files(info));
  int flipped = 0, detected = 0;
  for (const auto& [name, size] : info.metadata["files"].items()) {
    const auto path = newest / name;
    const std::string original = slurp(path);
    // Every offset of the first 256 bytes (headers), then every 61st, and the last byte: a CRC-32 detects any one
    // changed byte, so denser strides only rewrite files (every byte of files under 4 KiB and every 7th of the others
    // took 35 s, nearly all of it in the kernel).
    std::vector<std::size_t> offsets;
    for (std::size_t at = 0; at < original.size(); at += at < 256 ? 1 : 61) offsets.push_back(at);
    offsets.push_back(original.size() - 1);
    for (const auto at : offsets) {
      std::string damaged = original;
      damaged[at] = static_cast<char>(damaged[at] ^ (1 << (at % 8)));
      std::ofstream(path, std::ios::binary | std::ios::trunc) << damaged;
      ++flipped;
      try {
        ck::verify_files(info);
      } catch (const ck::error& e) {
        const std::string what = e.what();
        if (what.find("'" + name + "' do not match their checksum") != std::string::npos) ++detected;
      }
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << original;
  }
  CHECK(flipped > 500);
  CHECK(detected == flipped);
  CHECK_NOTHROW(ck::verify_files(info));

  // On resume, the damaged newest checkpoint is skipped with its reason and the previous one loads.
  flip_middle_byte(newest / "model.h5");
  const auto r = resume(base);
  CHECK(r.outcome == ck::resume_outcome::loaded);
  CHECK(r.step == 10);
  CHECK(values(r.model) == values(a));
  REQUIRE(r.log.size() == 1);
  CHECK(r.log[0].find("'model.h5' do not match their checksum") != std::string::npos);
  fs::remove_all(base);
}

TEST_CASE("checkpoint: a file of the format missing from metadata.json's list is damage, and changes are not missed") {
  auto base = temp_dir("manifest");
  const auto t0 = std::chrono::system_clock::now();
  const auto a = model(1), b = model(2);
  save(base, a, 10, false, t0);
  const auto newest = save(base, b, 20, false, t0 + std::chrono::seconds(1));
  // Take model.h5 out of the manifest (file list and checksum), then change its bytes: the load must not trust it.
  auto meta = nlohmann::json::parse(slurp(newest / "metadata.json"));
  meta["files"].erase("model.h5");
  meta["checksums"].erase("model.h5");
  std::ofstream(newest / "metadata.json", std::ios::trunc) << meta.dump(2);
  flip_middle_byte(newest / "model.h5");
  CHECK_THROWS_WITH_AS(ck::verify_files(ck::read_metadata(newest).value()),
                       doctest::Contains("metadata.json does not list 'model.h5'"), ck::error);
  const auto r = resume(base);
  CHECK(r.outcome == ck::resume_outcome::loaded);
  CHECK(r.step == 10);
  CHECK(values(r.model) == values(a));
  REQUIRE(r.log.size() == 1);
  CHECK(r.log[0].find("does not list 'model.h5'") != std::string::npos);
  // Any other file of the format present but unlisted is damage too.
  const auto older = base / "step-10";
  auto meta10 = nlohmann::json::parse(slurp(older / "metadata.json"));
  REQUIRE(meta10["files"].contains("training_state.h5"));
  meta10["files"].erase("training_state.h5");
  std::ofstream(older / "metadata.json", std::ios::trunc) << meta10.dump(2);
  CHECK_THROWS_WITH_AS(ck::verify_files(ck::read_metadata(older).value()),
                       doctest::Contains("'training_state.h5' is in the directory but metadata.json does not list it"),
                       ck::error);
  fs::remove_all(base);
}

TEST_CASE("checkpoint: a plain file where a step directory should be is reported with its reason") {
  auto base = temp_dir("stepfile");
  const auto t0 = std::chrono::system_clock::now();
  save(base, model(1), 10, false, t0);
  const auto newest = save(base, model(2), 20, false, t0 + std::chrono::seconds(1));
  fs::remove_all(newest);
  std::ofstream(newest) << "not a checkpoint";
  auto m = model(3);
  std::int64_t step = -1;
  auto load = [&](const ck::checkpoint_info& c) { step = ck::load_train_state<LMHeadModel>(c, m, nullptr, false).step; };
  std::vector<std::string> log;
  CHECK(ck::resume_newest(base, load, [&](const std::string& s) { log.push_back(s); }) == ck::resume_outcome::loaded);
  CHECK(step == 10);
  REQUIRE(log.size() == 1);
  CHECK(log[0].find("step-20' is not a directory") != std::string::npos);
  fs::remove_all(base);
}

TEST_CASE("checkpoint: step directories without metadata.json are reported and never trained over") {
  auto base = temp_dir("nometa");
  const auto t0 = std::chrono::system_clock::now();
  save(base, model(1), 10, false, t0);
  save(base, model(2), 20, false, t0 + std::chrono::seconds(1));
  fs::remove(base / "step-10" / "metadata.json");
  fs::remove(base / "step-20" / "metadata.json");
  auto m = model(3);
  auto load = [&](const ck::checkpoint_info& c) { ck::load_train_state<LMHeadModel>(c, m, nullptr, false); };
  std::vector<std::string> log;
  CHECK_THROWS_WITH_AS(ck::resume_newest(base, load, [&](const std::string& s) { log.push_back(s); }),
                       doctest::Contains("2 step directories without metadata.json"), ck::error);
  REQUIRE(log.size() == 2);
  CHECK(log[0].find("step-10: it has no metadata.json") != std::string::npos);
  // With one committed checkpoint left, it loads and the damaged one is named in the log.
  save(base, model(1), 10, false, t0);
  log.clear();
  CHECK(ck::resume_newest(base, load, [&](const std::string& s) { log.push_back(s); }) == ck::resume_outcome::loaded);
  REQUIRE(log.size() == 1);
  CHECK(log[0].find("step-20: it has no metadata.json") != std::string::npos);
  fs::remove_all(base);
}

TEST_CASE("checkpoint: a write that runs out of space leaves no trace and the committed checkpoint intact") {
  auto base = temp_dir("fsize");
  const auto a = model(1);
  save(base, a, 10, false);
  const auto committed = slurp(base / "step-10" / "model.h5");
  // A file-size limit makes writes fail with EFBIG, as a full disk makes them fail with ENOSPC, at a point that
  // moves with the limit: creating a file, inside HDF5's data writes, its flush, metadata.json.
  struct sigaction ignore {}, old {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGXFSZ, &ignore, &old);
  rlimit saved{};
  ::getrlimit(RLIMIT_FSIZE, &saved);
  int failures = 0;
  for (rlim_t limit : {rlim_t{0}, rlim_t{100}, rlim_t{1000}, rlim_t{3000}, rlim_t{6000}, rlim_t{9000}, rlim_t{12000},
                       rlim_t{20000}}) {
    rlimit r = saved;
    r.rlim_cur = limit;
    ::setrlimit(RLIMIT_FSIZE, &r);
    bool failed = false;
    try {
      save(base, model(2), 20, false);
    } catch (const ck::error& e) {
      failed = true;
      CHECK(std::string(e.what()).find(base.string()) != std::string::npos);
    }
    ::setrlimit(RLIMIT_FSIZE, &saved);
    failures += failed;
    // Whatever happened, nothing hidden is left, step-10 is untouched, and a step-20 exists only when complete.
    for (const auto& e : fs::directory_iterator(base)) CHECK(e.path().filename().string()[0] != '.');
    CHECK(slurp(base / "step-10" / "model.h5") == committed);
    CHECK_NOTHROW(ck::verify_files(ck::read_metadata(base / "step-10").value()));
    CHECK(fs::exists(base / "step-20") == !failed);
    if (!failed) CHECK_NOTHROW(ck::verify_files(ck::read_metadata(base / "step-20").value()));
    fs::remove_all(base / "step-20");
  }
  ::sigaction(SIGXFSZ, &old, nullptr);
  CHECK(failures >= 6);
  // After all those failures, writing still works.
  CHECK_NOTHROW(save(base, model(2), 20, false));
  fs::remove_all(base);
}

TEST_CASE("checkpointer: a second checkpointer on the same base path is refused, naming the holder") {
  ck::policy p;
  p.base_path = temp_dir("lock");
  {
    ck::checkpointer first(p);
    CHECK_THROWS_WITH_AS(ck::checkpointer{p},
                         doctest::Contains(("is in use by another process (pid " + std::to_string(::getpid()) + " on").c_str()),
                         ck::error);
  }
  CHECK_NOTHROW(ck::checkpointer{p});  // released with its holder
  fs::remove_all(p.base_path);
}
