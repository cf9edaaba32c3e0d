{
  "targets": [
    {
      "target_name": "switchyard_native",
      "sources": [
        "native/addon.cc",
        "native/prefix_index.cc",
        "native/flow_queues.cc",
        "native/upstream_client.cc",
        "native/upstream_core.cc",
        "native/h1_parser_probe.cc",
        "native/h1_request_probe.cc",
        "native/front_server.cc",
        "native/fd_limit.cc",
        "native/body_scan.cc"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NAPI_DISABLE_CPP_EXCEPTIONS", "NODE_ADDON_API_DISABLE_DEPRECATED", "NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS"],
      "cflags!": ["-fno-exceptions", "-O2", "-O3"],
      "cflags_cc!": ["-fno-exceptions", "-std=gnu++17", "-std=c++17", "-O2"],
      "cflags": ["-O3", "-fvisibility=hidden"],
      "cflags_cc": ["-std=c++20", "-O3", "-fvisibility=hidden", "-fno-exceptions", "-Wall", "-Wextra", "-Wno-unused-parameter"],
      "conditions": [
        ["OS=='linux' and '<!(echo $SWITCHYARD_SANITIZE)'=='1'", {
          "cflags": ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"],
          "cflags_cc": ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"],
          "ldflags": ["-fsanitize=address,undefined"]
        }]
      ]
    }
  ]
}
