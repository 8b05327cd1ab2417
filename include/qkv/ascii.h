// ASCII case folding for the names qkv compares without case: file extensions (".NPY" is
// an .npy file to qkv::io::load/save, qkv.save, the CLI and write_png), the CLI's output
// names, einsum's optimize names. Only A-Z change, whatever the C locale (Python sets
// one from the environment); other bytes, UTF-8 included, stay as they are.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace qkv {

// `text` with A-Z as a-z.
inline std::string ascii_lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// path.extension() (".npy"; "" when there is none) in lower case: what picks a file's format.
inline std::string lower_extension(const std::filesystem::path& path) { return ascii_lower(path.extension().string()); }

}  // namespace qkv
