# Sourced by the scripts that need llama.cpp's source tree: the one vendored in the
# llama-cpp-python sdist, whose version pins the llama.cpp commit the benchmarks compare with.
# Defines LLAMACPP_PYTHON_VERSION and llamacpp_tree SRC_DIR, which downloads and unpacks the
# sdist under SRC_DIR if needed and prints the tree's path; progress goes to stderr.

readonly LLAMACPP_PYTHON_VERSION=0.3.36

llamacpp_tree() {
    local src=$1
    local tree=$src/llama_cpp_python-$LLAMACPP_PYTHON_VERSION/vendor/llama.cpp
    local sdist=$src/llama_cpp_python-$LLAMACPP_PYTHON_VERSION.tar.gz
    if [ ! -f "$tree/CMakeLists.txt" ] || [ ! -f "$tree/convert_hf_to_gguf.py" ]; then
        mkdir -p "$src"
        if [ ! -f "$sdist" ]; then
            # Only llama-cpp-python itself comes as source; its build backend comes as wheels,
            # which pip needs just to read the sdist's metadata (nothing is compiled here).
            echo "downloading llama-cpp-python $LLAMACPP_PYTHON_VERSION (sdist)" >&2
            python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
                -d "$src" "llama-cpp-python==$LLAMACPP_PYTHON_VERSION"
        fi
        echo "unpacking $sdist" >&2
        tar xzf "$sdist" -C "$src"
    fi
    echo "$tree"
}
