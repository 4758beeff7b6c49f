#include "harness/engine/models.h"

#include <filesystem>

#include "harness/io/checkpoint.h"
#include "harness/io/errors.h"
#include "harness/io/files.h"
#include "harness/io/hf_config.h"

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
  return io::load_hf_config(dir);
}

bool generated_weights(const std::string& spec, const std::string& base_dir) {
  if (names_fixture(spec)) return true;
  const fs::path dir = directory_of(spec, base_dir);
  auto absent = [](const fs::path& p) { return io::path_type(p.string()) == fs::file_type::not_found; };
  return absent(dir / "model.safetensors") && absent(dir / "model.safetensors.index.json");
}

Weights model_weights(const std::string& spec, const std::string& base_dir, const ModelConfig& cfg,
                      uint64_t weight_seed) {
  if (generated_weights(spec, base_dir)) return generate_weights(cfg, weight_seed);
  return io::load_weights(directory_of(spec, base_dir), cfg);
}

}  // namespace bp::harness
