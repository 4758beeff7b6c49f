#include "harness/engine/models.h"

#include <algorithm>
#include <filesystem>

#include "harness/io/errors.h"
#include "harness/io/files.h"
#include "harness/io/hf_config.h"
#include "reference/truth/qwen3.h"

namespace bp::harness {

namespace fs = std::filesystem;

namespace {

std::string directory_of(const std::string& spec, const std::string& base_dir) {
  if (fs::path(spec).is_relative() && !base_dir.empty()) return (fs::path(base_dir) / spec).string();
  return spec;
}

std::string fixture_list() {
  std::string r;
  for (const EmbeddedFixture& f : embedded_fixtures()) r += (r.empty() ? "" : ", ") + std::string(f.name);
  return r;
}

// A name model weights are stored under, in any framework's format.
bool weight_file_name(const std::string& name) {
  auto ends = [&](std::string_view suffix) { return name.ends_with(suffix); };
  return ends(".safetensors") || ends(".safetensors.index.json") || ends(".bin.index.json") || ends(".pt") ||
         ends(".pth") || ends(".gguf") || ends(".msgpack") || ends(".flax") || ends(".h5") ||
         (name.starts_with("pytorch_model") && ends(".bin"));
}

// The directory's weight files and broken links ("x (a broken link to y)"), sorted.
std::vector<std::string> weight_files_found(const fs::path& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code ignored;
    if (e.is_symlink(ignored) && !fs::exists(e.path(), ignored))
      found.push_back(name + " (a broken link to " + fs::read_symlink(e.path(), ignored).string() + ")");
    else if (weight_file_name(name))
      found.push_back(name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string joined(const std::vector<std::string>& v) {
  std::string r;
  for (const std::string& s : v) r += (r.empty() ? "" : ", ") + s;
  return r;
}

WeightsOrigin generated_origin(const std::string& spec, uint64_t seed) {
  WeightsOrigin o;
  o.model = spec;
  o.seed = seed;
  return o;
}

WeightsOrigin checkpoint_origin(const std::string& spec, const io::LoadNotes& notes) {
  WeightsOrigin o;
  o.model = spec;
  o.files = notes.files;
  o.conversion = notes.conversion;
  return o;
}

}  // namespace

bool names_fixture(const std::string& spec) { return spec.find('/') == std::string::npos; }

ModelConfig model_config(const std::string& spec, const std::string& base_dir, const std::string& source,
                         const std::string& field) {
  if (names_fixture(spec)) {
    for (const EmbeddedFixture& f : embedded_fixtures())
      if (f.name == spec) return io::parse_hf_config(f.config_json, "fixture " + spec + "/config.json");
    throw io::BadInput(source, field,
                       "unknown model " + io::quoted_input(spec) + ": the fixtures are " + fixture_list() +
                           " (a checkpoint directory needs a '/', e.g. " + io::quoted_input("./" + spec) + ")");
  }
  const std::string dir = directory_of(spec, base_dir);
  const fs::file_type type = io::path_type(dir, source, field);
  if (type == fs::file_type::not_found) throw io::BadInput(source, field, "model directory " + io::quoted_input(dir) + " does not exist");
  if (type != fs::file_type::directory) throw io::BadInput(source, field, io::quoted_input(dir) + " is not a directory");
  ModelConfig cfg = io::load_hf_config(dir);
  (void)generated_weights(spec, base_dir);  // for its refusal: before any command does any work
  return cfg;
}

bool generated_weights(const std::string& spec, const std::string& base_dir) {
  if (names_fixture(spec)) return true;
  const fs::path dir = directory_of(spec, base_dir);
  auto absent = [](const fs::path& p) { return io::path_type(p.string()) == fs::file_type::not_found; };
  if (!absent(dir / "model.safetensors") || !absent(dir / "model.safetensors.index.json")) return false;
  const std::vector<std::string> found = weight_files_found(dir);
  if (!found.empty())
    throw io::BadInput(dir.string(), "",
                       "holds weights but no model.safetensors or model.safetensors.index.json: " + joined(found) +
                           "; bitparity reads a safetensors checkpoint (model.safetensors, or shards with their index) "
                           "and will not run weights made from --weight-seed in their place");
  return true;
}

Weights model_weights(const std::string& spec, const std::string& base_dir, const ModelConfig& cfg,
                      uint64_t weight_seed, const io::LoadOptions& opt, WeightsOrigin& origin) {
  if (generated_weights(spec, base_dir)) {
    origin = generated_origin(spec, weight_seed);
    return generate_weights(cfg, weight_seed);
  }
  io::LoadNotes notes;
  Weights w = io::load_weights(directory_of(spec, base_dir), cfg, opt, &notes);
  origin = checkpoint_origin(spec, notes);
  return w;
}

truth::Model truth_model(const std::string& spec, const std::string& base_dir, const ModelConfig& cfg,
                         uint64_t weight_seed, const io::LoadOptions& opt, WeightsOrigin& origin) {
  if (generated_weights(spec, base_dir)) {
    origin = generated_origin(spec, weight_seed);
    return truth::Model(cfg, generate_weights(cfg, weight_seed));
  }
  io::LoadNotes notes;
  truth::WeightsD wd;
  for (auto& [name, t] : io::load_weights_fp32(directory_of(spec, base_dir), cfg, opt, &notes)) {
    const Eigen::Index rows = t.shape.size() == 1 ? 1 : t.shape[0];  // 1-D weights are one row
    using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    wd.emplace(name, Eigen::Map<const MatF>(t.data.data(), rows, static_cast<Eigen::Index>(t.data.size()) / rows)
                         .cast<double>());
  }
  origin = checkpoint_origin(spec, notes);
  return truth::Model(cfg, std::move(wd));
}

std::vector<std::string> model_files(const std::string& spec, const std::string& base_dir) {
  std::vector<std::string> files;
  if (names_fixture(spec)) return files;
  std::error_code ec;
  for (fs::directory_iterator it(directory_of(spec, base_dir), ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) files.push_back(it->path().string());
  return files;
}

}  // namespace bp::harness
