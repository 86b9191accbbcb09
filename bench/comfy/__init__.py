"""The ComfyUI end-to-end benchmark, ``python -m comfyui_ideogram4_int8.bench.comfy`` (``cli.py``: what it runs).

Its modules, each importing only those listed after it:

  cli        the command line: the options, and which run a call makes
  inprocess  every peer in this process (no ``--vram``)
  parent     ``--vram``: a child process per (peer, card size), then the ratios and tables
  child      one ``--vram`` run in a process of its own
  peers      what each peer loads and how: layouts, the synthetic files, its MODELs, compiled clones, the samplers
  comfyui    ComfyUI in this process, as a library or as its server sets it up
  device     the card: memory peaks, an emulated smaller card, the host-to-device bandwidth
  report     the result's schema, the ratios, every table printed, the plot (imports no run)
"""
