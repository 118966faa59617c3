//! Multi-pointwise kernels: independent pointwise programs (members) in one launch.
//!
//! Every member's domain is cut into tiles of `block * vec * steps` elements; a static work list
//! holds one `(member, tile)` record per block, so a block finds its work with one load and a
//! `switch` on the member, whatever the members' sizes. Inside its case, a member's program is
//! emitted exactly as a pointwise kernel's (loads the same everywhere hoisted, 16-byte vector
//! loads and stores where aligned, each thread `vec` consecutive elements per step); the
//! elements past a member's last whole vector are done by the block of its last tile, before
//! its loop.

use crate::body::{check_body, BodyRules};
use crate::error::{invalid_config, malformed, Result};
use crate::index::IndexWidth;
use crate::pointwise::{analyze_loads, check_config, describe_loads, BodyEmit, SlotTypes, Span};
use crate::writer::CodeWriter;
use crate::{Emitted, Launch, Param, TableSpec, Unit};
use braze_plan::MultiPointwise;

/// Bytes of one `Tile` record of the work list (see the struct in the source).
const TILE_BYTES: usize = 8;

/// Most tiles (blocks) one launch may have: a grid's x extent.
const MAX_TILES: usize = i32::MAX as usize;

/// Tile `index` of `member`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tile {
    pub(crate) member: u32,
    pub(crate) index: u32,
}

/// A member's iteration units (vectors, or elements when `vec` is 1), the elements past its last
/// whole vector, and its tiles of `tile_units` units (at least one when there is a tail).
fn member_tiles(numel: usize, vec: usize, tile_units: usize) -> (usize, usize, usize) {
    let units = numel / vec;
    let tail = numel % vec;
    let tiles = units.div_ceil(tile_units).max(usize::from(tail > 0));
    (units, tail, tiles)
}

/// The work list: every tile of member 0, then of member 1, and so on.
pub(crate) fn work_list(numels: &[usize], vec: usize, tile_units: usize) -> Vec<Tile> {
    let mut tiles = Vec::new();
    for (member, &numel) in numels.iter().enumerate() {
        let (_, _, count) = member_tiles(numel, vec, tile_units);
        tiles.extend((0..count).map(|index| Tile { member: member as u32, index: index as u32 }));
    }
    tiles
}

fn encode_tiles(tiles: &[Tile]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(tiles.len() * TILE_BYTES);
    for t in tiles {
        bytes.extend_from_slice(&t.member.to_le_bytes());
        bytes.extend_from_slice(&t.index.to_le_bytes());
    }
    bytes
}

pub(crate) fn generate(
    unit: &mut Unit<'_>,
    multi: &MultiPointwise,
    block: u32,
    vec: u32,
    steps: u32,
) -> Result<Emitted> {
    check_config(unit, block, vec, 1)?;
    let kernel = unit.kernel;
    let name = kernel.name.clone();
    if steps == 0 || steps > 64 {
        return Err(invalid_config(&name, format!("steps {steps} is not in 1..=64")));
    }
    if multi.members.is_empty() {
        return Err(malformed(&name, "a multi-pointwise kernel without members"));
    }
    for member in &multi.members {
        let rules = BodyRules {
            inputs: kernel.inputs.len(),
            outputs: kernel.outputs.len(),
            rank: member.shape.rank(),
            reductions: false,
        };
        check_body(&name, &member.body, &rules)?;
    }
    let vec = vec as usize;
    let tile_units = block as usize * steps as usize;
    let numels: Vec<usize> = multi.members.iter().map(|m| m.shape.numel()).collect();
    let tiles = work_list(&numels, vec, tile_units);
    if tiles.len() > MAX_TILES {
        return Err(malformed(&name, format!("{} tiles are more than one grid holds", tiles.len())));
    }
    let largest = numels.iter().copied().max().unwrap_or(0);
    let width = IndexWidth::for_largest(largest.max(unit.largest_buffer()));
    let lit = |n: usize| width.lit(n);
    let slots = SlotTypes::of(unit);

    let (mut declared, mut params) = unit.buffer_params();
    declared.push("const Tile* __restrict__ tiles".into());
    params.push(Param::Table(0));
    let mut w = CodeWriter::new();
    if multi.members.iter().any(|m| crate::gather::body_gathers(&m.body)) {
        for line in crate::gather::CHECKED_INDEX.lines() {
            w.line(line);
        }
    }
    w.line("// Tile `index` of member `member`: one block's work.");
    w.open("struct Tile");
    w.line("unsigned member;");
    w.line("unsigned index;");
    w.close_with(";");
    w.line("");
    // `, 1`: ptxas otherwise aims at several blocks per SM and held a kernel of small members to
    // 32 registers, spilling (GPU fuzz seed 7,700,020: a floor member beside a divide member).
    w.open(format!("extern \"C\" __global__ void __launch_bounds__({block}, 1) {name}({})", declared.join(", ")));
    w.line("const Tile task = tiles[blockIdx.x];");
    w.open("switch (task.member)");
    let mut notes = Vec::new();
    for (m, member) in multi.members.iter().enumerate() {
        let numel = numels[m];
        let (units, _, count) = member_tiles(numel, vec, tile_units);
        if count == 0 {
            w.line(format!("// member {m} over {}: no elements", member.shape));
            continue;
        }
        w.open(format!("case {m}u:"));
        let tiles_said = if count == 1 { "1 tile".to_string() } else { format!("{count} tiles") };
        w.line(format!("// member {m} over {} ({numel} elements): {tiles_said}", member.shape));
        let loads = analyze_loads(&member.body, member.shape.dims(), vec);
        if units > 0 {
            w.line(format!("const idx_t begin = (idx_t)task.index * {};", lit(tile_units)));
            w.line(format!(
                "const idx_t end = begin + {tile} < {units} ? begin + {tile} : {units};",
                tile = lit(tile_units),
                units = lit(units)
            ));
        }
        let span = Span {
            first: "begin + threadIdx.x".into(),
            step: lit(block as usize),
            end: "end".into(),
            tail_block: format!("task.index == {}u", count - 1),
            tail_comment: "one per thread of the member's last tile",
            tail_first: true,
        };
        let emit = BodyEmit {
            kernel: &name,
            body: &member.body,
            dims: member.shape.dims(),
            loads: &loads,
            slots: &slots,
            vec,
            width,
            run_time: false,
        };
        emit.emit(&mut w, &mut unit.helpers, &span)?;
        w.line("break;");
        w.close();
        let described = describe_loads(&loads);
        if !described.is_empty() {
            notes.push(format!("member {m} loads: {}", described.join(", ")));
        }
    }
    w.line("default: break;");
    w.close();
    w.close();

    let launches = Launch::per_work_item(&name, tiles.len(), block, params);
    notes.insert(0, format!("work list: {} tiles of up to {} elements each", tiles.len(), tile_units * vec));
    Ok(Emitted {
        summary: format!(
            "multi_pointwise over {} members ({} elements)",
            multi.members.len(),
            numels.iter().sum::<usize>()
        ),
        notes,
        width: Some(width),
        code: w.finish(),
        launches,
        scratch: Vec::new(),
        tables: vec![TableSpec::Static(encode_tiles(&tiles))],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_list_covers_every_member_and_gives_tails_a_tile() {
        // 10 elements at vec 4: 2 vectors and a tail of 2; tiles of 1 vector: 2 tiles.
        // 3 elements: no whole vector, one tile for the tail. 0 elements: no tile.
        let tiles = work_list(&[10, 3, 0, 9], 4, 1);
        let pairs: Vec<(u32, u32)> = tiles.iter().map(|t| (t.member, t.index)).collect();
        assert_eq!(pairs, [(0, 0), (0, 1), (1, 0), (3, 0), (3, 1)]);
        assert_eq!(member_tiles(4096, 1, 256), (4096, 0, 16));
        assert_eq!(encode_tiles(&tiles[..1]), [0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(encode_tiles(&tiles[4..]), [3, 0, 0, 0, 1, 0, 0, 0]);
    }
}
