// Runs a libFuzzer target without libFuzzer: feeds every file named on the
// command line (directories are walked recursively, in sorted order) to
// LLVMFuzzerTestOneInput once. Built with any compiler, so that the seed
// corpus and saved crash inputs run as an ordinary test.
//
//   message_fuzz_replay tests/fuzz/corpus/message [crash-1234 ...]
//
// Exits 0 when every input ran (the target aborts on a finding), 1 when an
// argument cannot be read or names no input at all.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

bool ReadFile(const fs::path& path, std::vector<uint8_t>* bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  bytes->assign(std::istreambuf_iterator<char>(in),
                std::istreambuf_iterator<char>());
  return !in.bad();
}

// Regular files named by `arg`, sorted; false when it cannot be listed.
bool CollectInputs(const fs::path& arg, std::vector<fs::path>* inputs) {
  std::error_code error;
  if (fs::is_directory(arg, error)) {
    std::vector<fs::path> found;
    fs::recursive_directory_iterator it(arg, error), end;
    for (; !error && it != end; it.increment(error)) {
      if (it->is_regular_file(error)) found.push_back(it->path());
    }
    if (error) return false;
    std::sort(found.begin(), found.end());
    inputs->insert(inputs->end(), found.begin(), found.end());
    return true;
  }
  if (fs::is_regular_file(arg, error)) {
    inputs->push_back(arg);
    return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
    return 1;
  }
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    if (!CollectInputs(argv[i], &inputs)) {
      std::fprintf(stderr, "cannot read '%s'\n", argv[i]);
      return 1;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "no inputs found\n");
    return 1;
  }
  std::vector<uint8_t> bytes;
  for (const fs::path& input : inputs) {
    if (!ReadFile(input, &bytes)) {
      std::fprintf(stderr, "cannot read '%s'\n", input.c_str());
      return 1;
    }
    std::fprintf(stderr, "running %s (%zu bytes)\n", input.c_str(),
                 bytes.size());
    // A copy of exactly the input's size, so that a sanitizer build catches
    // reads past the end as libFuzzer would.
    std::vector<uint8_t> exact(bytes.begin(), bytes.end());
    LLVMFuzzerTestOneInput(exact.data(), exact.size());
  }
  std::printf("replayed %zu inputs\n", inputs.size());
  return 0;
}
