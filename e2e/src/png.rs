//! A PNG decoder for Chromium's screenshots (8-bit RGB or RGBA, not interlaced: what headless
//! Chromium writes), so the dashboard tests assert on the pixels a person sees, not only on the
//! DOM. Anything else is an error that says what it met.

use std::io::Read;

/// An image as rows of RGB pixels.
pub struct Image {
    pub width: usize,
    pub height: usize,
    rgb: Vec<[u8; 3]>,
}

impl Image {
    pub fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        self.rgb[y * self.width + x]
    }

    /// Pixels in the rectangle (clipped to the image) for which `keep` holds.
    pub fn count(&self, left: usize, top: usize, width: usize, height: usize, keep: impl Fn([u8; 3]) -> bool) -> usize {
        let (right, bottom) = ((left + width).min(self.width), (top + height).min(self.height));
        (top..bottom).flat_map(|y| (left..right).map(move |x| (x, y))).filter(|&(x, y)| keep(self.pixel(x, y))).count()
    }
}

pub fn decode(bytes: &[u8]) -> Result<Image, String> {
    let body = bytes.strip_prefix(b"\x89PNG\r\n\x1a\n").ok_or("not a PNG")?;
    let (mut pos, mut idat, mut header) = (0, Vec::new(), None);
    while pos + 8 <= body.len() {
        let len = u32::from_be_bytes(body[pos..pos + 4].try_into().map_err(|_| "chunk length")?) as usize;
        let kind = &body[pos + 4..pos + 8];
        let data = body.get(pos + 8..pos + 8 + len).ok_or("truncated chunk")?;
        match kind {
            b"IHDR" => header = Some(data.to_vec()),
            b"IDAT" => idat.extend_from_slice(data),
            b"IEND" => break,
            _ => {}
        }
        pos += 12 + len;
    }
    let h = header.ok_or("no IHDR")?;
    let width = u32::from_be_bytes(h[0..4].try_into().map_err(|_| "width")?) as usize;
    let height = u32::from_be_bytes(h[4..8].try_into().map_err(|_| "height")?) as usize;
    let (depth, color, interlace) = (h[8], h[9], h[12]);
    let channels = match (depth, color, interlace) {
        (8, 2, 0) => 3,
        (8, 6, 0) => 4,
        other => return Err(format!("unsupported PNG (depth, colour type, interlace) {other:?}")),
    };
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(&idat[..]).read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let stride = width * channels;
    if raw.len() < height * (stride + 1) {
        return Err("short image data".into());
    }
    let mut prev = vec![0u8; stride];
    let mut rgb = Vec::with_capacity(width * height);
    for y in 0..height {
        let line = &raw[y * (stride + 1)..(y + 1) * (stride + 1)];
        let mut cur = line[1..].to_vec();
        for i in 0..stride {
            let a = if i >= channels { cur[i - channels] } else { 0 };
            let b = prev[i];
            let c = if i >= channels { prev[i - channels] } else { 0 };
            cur[i] = cur[i].wrapping_add(match line[0] {
                0 => 0,
                1 => a,
                2 => b,
                3 => ((u16::from(a) + u16::from(b)) / 2) as u8,
                4 => {
                    let p = i16::from(a) + i16::from(b) - i16::from(c);
                    let (pa, pb, pc) = ((p - i16::from(a)).abs(), (p - i16::from(b)).abs(), (p - i16::from(c)).abs());
                    if pa <= pb && pa <= pc {
                        a
                    } else if pb <= pc {
                        b
                    } else {
                        c
                    }
                }
                f => return Err(format!("bad filter {f}")),
            });
        }
        rgb.extend(cur.chunks(channels).map(|p| [p[0], p[1], p[2]]));
        prev = cur;
    }
    Ok(Image { width, height, rgb })
}
