# Sourced by the scripts that need llama.cpp's source tree: the one vendored in the
# llama-cpp-python sdist, whose version pins the llama.cpp commit the benchmarks compare with.
# Defines LLAMACPP_PYTHON_VERSION; llamacpp_tree SRC_DIR, which downloads and unpacks the sdist
# under SRC_DIR if needed and prints the tree's path (progress goes to stderr); and
# llamacpp_convert, which runs the tree's converter on a checkpoint without a tokenizer.

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

# llamacpp_convert PY TREE CHECKPOINT NAME OUTTYPE OUTFILE LOG [STUB_ARGS...]: converts the
# Hugging Face checkpoint directory CHECKPOINT (config.json, generation_config.json,
# model.safetensors) to OUTFILE with TREE's convert_hf_to_gguf.py run by PY. The converter
# insists on a tokenizer, so it reads a temporary copy named NAME (it derives general.name from
# the directory) carrying tools/gguf_stub_tokenizer.py's stub (STUB_ARGS passed on, e.g.
# --loadable). Its output goes to LOG, whose tail is shown when it fails; OUTFILE appears only
# when it succeeds.
llamacpp_convert() {
    local py=$1 tree=$2 checkpoint=$3 name=$4 outtype=$5 outfile=$6 log=$7
    shift 7
    local tools work status=0
    tools=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    work=$(mktemp -d)
    mkdir -p "$work/$name"
    ln -s "$(cd "$checkpoint" && pwd)/model.safetensors" "$work/$name/model.safetensors"
    cp "$checkpoint"/{config.json,generation_config.json} "$work/$name/"
    "$py" "$tools/gguf_stub_tokenizer.py" "$work/$name" "$@" || status=$?
    if [ "$status" -eq 0 ]; then
        PYTHONPATH=$tree/gguf-py "$py" "$tree/convert_hf_to_gguf.py" "$work/$name" \
            --outtype "$outtype" --outfile "$outfile.part" >"$log" 2>&1 || status=$?
        if [ "$status" -eq 0 ]; then
            mv "$outfile.part" "$outfile" || status=$?
        else
            tail -30 "$log" >&2
        fi
    fi
    rm -rf "$work"
    return "$status"
}
