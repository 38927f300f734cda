"""Reports: :mod:`model` computes the one ``Report`` every renderer takes; renderers only format."""
